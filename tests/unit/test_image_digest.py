"""The digest in a container's image id as Kubernetes reports it (training/steps.py image_digest): what the
model's lineage records as `lineage.image_digest`."""

from __future__ import annotations

import pytest

from training.steps import image_digest

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "image_id",
    [
        f"registry.example.com/mlops-fraud-training@{DIGEST}",  # containerd, CRI-O
        f"docker-pullable://registry.example.com:5000/mlops/training@{DIGEST}",  # dockershim
        DIGEST,  # an image the node has by id only
    ],
)
def test_the_digest_is_taken_from_each_form_a_node_reports(image_id):
    assert image_digest(image_id) == DIGEST


@pytest.mark.parametrize(
    "image_id",
    [
        "registry.example.com/mlops-fraud-training:0.1.0",
        "sha256:abc",
        f"md5:{'0' * 64}",
        f"x@sha256:{'G' * 64}",
    ],
)
def test_no_digest_is_made_up_where_there_is_none(image_id):
    assert image_digest(image_id) is None


TAGGED = "registry.example.com:5000/mlops/training:0.1.0"
BY_DIGEST = f"registry.example.com:5000/mlops/training@{DIGEST}"


@pytest.mark.parametrize(
    "image_id",
    [BY_DIGEST, f"docker-pullable://{BY_DIGEST}", DIGEST, None],  # None, or by id only: the tag's repository
)
def test_a_reproduce_pod_runs_the_versions_image_by_digest_as_a_pod_can_name_it(image_id):
    from training.reproduce import image_by_digest

    made = {"model_version": "3", "image": TAGGED, "image_id": image_id, "image_digest": DIGEST}
    assert image_by_digest(made) == BY_DIGEST


def test_a_version_without_a_digest_names_the_commit_to_reproduce_it_from():
    from training.reproduce import ReproduceError, image_by_digest

    made = {
        "model_version": "3",
        "image": "local",
        "image_id": None,
        "image_digest": None,
        "git_commit": "c0ffee",
    }
    with pytest.raises(ReproduceError, match=r"v3 recorded no image digest .* commit c0ffee"):
        image_by_digest(made)
