"""Stage 2 (DimReduce) through ms_boost.Model, as the multi-rank tests build it (loopback ranks in
tests/test_dim_reduce_msrun.py, the msrun job of tests/workers/e2e_graph.py)."""

from mindspore import nn

from ms_boost import Model
from ms_boost.dim_reduce import DimReduceUpdate


def stage2_model(net, ckpt_dir: str, pca_path: str, k: int) -> Model:
    """The tutorial's stage-2 Model call (device_num 8, tutorial hyper-parameters)."""
    boost = {"boost": {"mode": "manual", "dim_reduce": True}, "common": {"device_num": 8},
             "dim_reduce": {"rho": 0.55, "gamma": 0.9, "alpha": 0.001, "sigma": 0.4, "n_component": k,
                            "pca_mat_path": pca_path, "weight_load_dir": ckpt_dir, "timeout": 120}}
    return Model(net, loss_fn=nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                 optimizer=nn.SGD(net.trainable_params(), learning_rate=1), metrics={"acc"}, boost_level="O1",
                 boost_config_dict=boost)


def dim_reduce_stage(model: Model) -> DimReduceUpdate:
    """The DimReduce stage inside a Model's train network."""
    return [c for _, c in model.train_network.cells_and_names() if isinstance(c, DimReduceUpdate)][0]
