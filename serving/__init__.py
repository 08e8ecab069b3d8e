"""The scoring service: champion ONNX model, online features kept current, micro-batching, scoring log."""
