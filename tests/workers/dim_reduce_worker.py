"""msrun worker: stage 2 (DimReduce) through ms_boost.Model on every rank; saves weights and stage state.

Usage: dim_reduce_worker.py MODE WEIGHT_LOAD_DIR PCA_MAT_PATH N_COMPONENTS STEPS PER_RANK_BATCH
Step s of rank r trains on rows [s*B*R + r*B, s*B*R + (r+1)*B) of a fixed data set, so one process on the
concatenated batch of B*R rows is the reference. Rank 0 computes the PCA matrix into PCA_MAT_PATH from the
checkpoints in WEIGHT_LOAD_DIR; every rank keeps its own block of rows.
"""
import sys

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


def main() -> None:
    from tests.helpers.msrun import save_result
    from tests.helpers.nets import dataset, weights
    from tests.workers.common import data_parallel_shard, make_plain_net

    mode, ckpt_dir, pca_path = sys.argv[1], sys.argv[2], sys.argv[3]
    k, steps, batch = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    _, _, x, y = data_parallel_shard(mode, steps, batch)
    net = make_plain_net()
    model = stage2_model(net, ckpt_dir, pca_path, k)
    model.train(1, dataset(x, y, batch_size=batch), dataset_sink_mode=False)
    stage = dim_reduce_stage(model)
    result = {f"w{i}": w for i, w in enumerate(weights(net))}
    result.update(pca_rows=stage.pca_rows.asnumpy(), inv_hessian=stage.inv_hessian.asnumpy(),
                  step_last=stage.step_last.asnumpy())
    save_result(**result)


if __name__ == "__main__":
    main()
