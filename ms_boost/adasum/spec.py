"""AdaSum as the pipeline sees it: its ``adasum`` section and its ``SPEC``."""
from __future__ import annotations

import dataclasses
from typing import Tuple, Union

from ms_boost.adasum.section import PLAN, AdaSumConfig
from ms_boost.adasum.stage import AdaSumUpdate
from ms_boost.comm import GradReducer
from ms_boost.spec import BuildContext

__all__ = ["AdaSumConfig", "SPEC"]


def _reducer(weights, cfg: AdaSumConfig, ctx: BuildContext) -> GradReducer:
    """Gradients are averaged only among the ranks of a server; AdaSum combines the servers."""
    topology = ctx.topology
    group = topology.server_group()
    return GradReducer(weights, topology.mean, topology.server_size, group, enabled=group is not None)


def _stage(inner, weights, cfg: AdaSumConfig, ctx: BuildContext) -> AdaSumUpdate:
    return AdaSumUpdate(inner, weights, ctx.common.device_number, topology=ctx.topology)


def _describe(cfg: AdaSumConfig, ctx: BuildContext) -> Union[str, Tuple[str, str]]:
    topology = ctx.topology
    if topology.size == 1:
        return "no gradient reduction (1 rank); AdaSum inactive"
    if topology.num_servers > 1:
        return (f"mean within each server ({topology.server_size} rank(s) per server)",
                f"AdaSum of the servers' weight deltas across {topology.num_servers} servers")
    return (f"mean all-reduce across {topology.size} ranks (one server of common.device_number="
            f"{topology.device_number}: AdaSum inactive)")


#: AdaSum for the pipeline: the server-local gradient mean and the update stage combining server deltas.
SPEC = dataclasses.replace(PLAN, reducer=_reducer, stage=_stage, describe=_describe)
