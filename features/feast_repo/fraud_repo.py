"""The repository as the `feast` CLI reads it (`feast plan`, `feast apply`): the CLI imports every .py file
under the folder it is given and collects the Feast objects it finds at module level.

This folder has no __init__.py on purpose: it is not part of the `features` package, so nothing imports
it but the CLI, which is a composition root of its own and may read the settings when it loads the file.
Usage (after `features.repo.open_store` or `apply` has written the rendered configuration):

    feast -c features/feast_repo -f "$MLOPS_HOME/feast/feature_store.yaml" plan

In an installed copy (an image), `features.repo.cli_repo_dir()` gives this folder's path for `-c`.
"""

from core.settings import get_settings
from features.definitions import build_definitions

_repo = build_definitions(get_settings().lake)

customer = _repo.customer
merchant = _repo.merchant
customer_features_source = _repo.customer_source
merchant_features_source = _repo.merchant_source
customer_stats_fv = _repo.customer_stats_fv
merchant_stats_fv = _repo.merchant_stats_fv
fraud_model_v1 = _repo.fraud_model_v1
