"""Validate Kubernetes objects against the official OpenAPI schema of one Kubernetes version.

Runs inside the infra tools venv (scripts/infra_tools.sh prints its path), where kubernetes-validate and
the schemas it ships live, so the project's own environment never imports it. Reads a JSON array of
objects on stdin and writes a JSON array with one verdict per object, in order: {"kind", "name", "error"}
with error null when the object is valid. Strict mode: a field the schema does not know (a typo such as
`readOnlyRootFilesytem`) is an error, not silently ignored as the API server would.

    tools=$(bash scripts/infra_tools.sh)
    "$tools/bin/python" infra/tools/k8s_schema_check.py --kubernetes-version 1.33 < objects.json
"""

from __future__ import annotations

import argparse
import json
import sys

import kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError, VersionNotSupportedError


def verdict(obj: dict, version: str) -> dict:
    name = (obj.get("metadata") or {}).get("name")
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(part) for part in exc.path) or "(root)"
        return {"kind": obj.get("kind"), "name": name, "error": f"{where}: {exc.message}"}
    except (SchemaNotFoundError, VersionNotSupportedError) as exc:
        return {"kind": obj.get("kind"), "name": name, "error": exc.message}
    return {"kind": obj.get("kind"), "name": name, "error": None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-version", required=True)
    version = parser.parse_args().kubernetes_version
    objects = json.load(sys.stdin)
    json.dump([verdict(obj, version) for obj in objects], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
