"""Each torchrun process trains on its own GPU (training/loop.py choose_device, Distributed.start): the
device follows LOCAL_RANK, the process makes it the current CUDA device before joining the group, and NCCL
is bound to it (`device_id`). Without them every rank's tensors and NCCL communicator land on cuda:0.

No GPU here: CUDA's device queries and the two calls that need a driver are replaced by recorders, so these
check what is asked of torch and in which order; only a machine with several GPUs can run it for real (the
GPU checks of docs/benchmarks.md)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from training.loop import Distributed, choose_device


@pytest.fixture
def four_gpus(monkeypatch):
    """torchrun's environment for the third of four processes on a node with four GPUs; the calls that
    would reach a driver are recorded instead."""
    calls: list[tuple] = []
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        dist, "init_process_group", lambda **kwargs: calls.append(("init_process_group", kwargs))
    )
    return calls


@pytest.mark.parametrize("requested", ["auto", "cuda"])
def test_a_gpu_named_without_an_index_is_the_local_ranks_own(four_gpus, requested):
    group = Distributed()
    assert choose_device(requested, group.local_rank) == torch.device("cuda", 2)


def test_the_process_sets_its_gpu_then_binds_nccl_to_it(four_gpus):
    group = Distributed()
    device = choose_device("auto", group.local_rank)
    group.start(device)
    assert four_gpus == [
        ("set_device", torch.device("cuda", 2)),
        ("init_process_group", {"backend": "nccl", "device_id": torch.device("cuda", 2)}),
    ]


def test_more_processes_than_gpus_share_them_in_turn(four_gpus, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert choose_device("auto", Distributed().local_rank) == torch.device("cuda", 1)


def test_an_explicit_device_index_and_the_cpu_are_left_as_named(four_gpus):
    assert choose_device("cuda:3", 2) == torch.device("cuda", 3)
    assert choose_device("cpu", 2) == torch.device("cpu")
    group = Distributed()
    group.start(torch.device("cpu"))
    assert four_gpus == [("init_process_group", {"backend": "gloo"})]


def test_a_single_process_joins_no_group(four_gpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    Distributed().start(torch.device("cuda", 0))
    assert four_gpus == []


def test_init_process_group_takes_the_device_id_argument():
    """The keyword the binding uses is torch's own (a rename fails here, not on a GPU node)."""
    import inspect

    assert "device_id" in inspect.signature(dist.init_process_group).parameters
