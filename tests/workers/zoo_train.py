"""msrun worker: ``train.py``'s ``main`` with the JSON list of arguments in argv[1]; saves this rank's train state.

Each rank saves every Parameter of its train network after training (``rank_<r>.npz``) and its losses.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from model_zoo.resnet import train as zoo_train  # noqa: E402
from tests.helpers.msrun import save_result  # noqa: E402

results = zoo_train.main(json.loads(sys.argv[1]))
state = {p.name: p.asnumpy() for p in results["model"].train_network.get_parameters()}
save_result(losses=results["losses"], initial_epoch=results["initial_epoch"], **state)
