"""Check a launcher's ``--config FILE --key value ...`` the way train.py / eval.py will parse them.

    python scripts/check_overrides.py --config model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml --epoch_size 2

Exit status 0 when the recipe and every override parse; else 2 with the parser's message (unknown key with its
closest match, bad value, stray argument). Used by the launchers in ``scripts/`` (dry runs included) so a typo
stops the launch before any process starts. Only the YAML and the overrides are read: the config parser is
loaded without importing MindSpore (about 0.1 s instead of seconds). When the command line touches the boost plan
(:func:`touches_plan`) the plan is checked as the run builds it (``boost_plan.check_boost_plan``), also without
MindSpore: ms_boost's configuration pieces (``AutoBoost``, the sections and ``PLAN`` of every built-in in
``ms_boost.plans``, the ``autotune`` options) load without the package's ``__init__``; same verdicts and messages
as the full import (tests/test_scripts.py compares them). Measured (median of 5, idle-ish machine): the O1 command
line with ``--boost_config_dict.grad_freeze.freeze_p 0.5`` 0.14 s wall / 0.23 CPU-s, against 2.0 s / 1.7 CPU-s
when the plan's check imported MindSpore (docs/testing.md, tenth session).
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check_boost_sections(cfg) -> None:
    """The recipe's boost plan with the overrides, checked as the run will (``boost_plan.check_boost_plan``: THOR takes
    no boost key and only level O0; ``autotune.plan`` and the ``autotune`` options; ``ms_boost.AutoBoost``'s check of
    every section; a command-line section of an algorithm the plan leaves off): its error names the key and what is
    allowed."""
    from model_zoo.resnet.src.boost_plan import check_boost_plan

    check_boost_plan(cfg)


#: command-line keys that change the boost plan: with one of them the plan is checked (ms_boost's config pieces)
PLAN_KEYS = ("boost_level", "optimizer")
PLAN_SECTIONS = ("boost_config_dict.", "autotune.")


def touches_plan(cfg) -> bool:
    """Whether the boost plan may hold something the zoo's own recipes were not checked with: the command line sets part
    of it (a key of :data:`PLAN_KEYS` or below :data:`PLAN_SECTIONS`) or adds a key the recipe lacks, or the recipe is
    a user's (not one of ``model_zoo/resnet/configs``; its sections and levels are checked as the run builds them)."""
    from model_zoo.resnet.src.config import added_keys, command_line_keys, config_source

    source = config_source(cfg)
    if source and Path(source).resolve().parent != (ROOT / "model_zoo" / "resnet" / "configs").resolve():
        return True
    return bool(added_keys(cfg)) or any(key in PLAN_KEYS or key.startswith(PLAN_SECTIONS)
                                        for key in command_line_keys(cfg))


def _light() -> bool:
    """Whether ``ms_boost`` in this process is the light one (its packages' ``__init__`` not run)."""
    package = sys.modules.get("ms_boost")
    return isinstance(package, types.ModuleType) and not hasattr(package, "AutoBoost")


def _forget_light_imports(keep=()) -> None:
    """Forget ms_boost's and the zoo's modules (but those in ``keep``, loaded before the light ones)."""
    for name in [n for n in sys.modules if (n == "ms_boost" or n.startswith(("ms_boost.", "model_zoo")))
                 and n not in keep]:
        del sys.modules[name]


def _stub_packages() -> None:
    """``ms_boost`` and each of its packages as a bare package: their modules load, no ``__init__`` runs (those
    import MindSpore and the cells)."""
    for init in sorted((ROOT / "ms_boost").rglob("__init__.py")):
        name = ".".join(init.parent.relative_to(ROOT).parts)
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [str(init.parent)]
            sys.modules[name] = stub
            if "." in name:
                setattr(sys.modules[name.rsplit(".", 1)[0]], name.rsplit(".", 1)[1], stub)


def _light_plan_check():
    """``boost_plan.check_boost_plan`` on ms_boost's configuration pieces alone: a registry holding the built-ins'
    ``PLAN`` (their specs without the hooks that build cells; ``AutoBoost`` reads nothing else)."""
    _stub_packages()
    from ms_boost import registry
    from ms_boost.plans import BUILTIN_PLANS

    if not registry.builtin_specs():
        for plan in BUILTIN_PLANS:
            registry.register_builtin(plan)
    from model_zoo.resnet.src.boost_plan import check_boost_plan

    return check_boost_plan


def _parse_config(light: bool = True):
    """``model_zoo.resnet.src.config.parse_config``; with ``light`` without running ``ms_boost/__init__``
    (MindSpore), else the real one (what a light import loaded is forgotten first)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if not light and _light():
        _forget_light_imports()
    if light and "ms_boost" not in sys.modules:
        _stub_packages()  # submodules load; the packages' __init__ do not run
        try:
            from model_zoo.resnet.src.config import parse_config
            return parse_config
        except ImportError:  # the parser came to need more of ms_boost: import it for real
            _forget_light_imports()
    from model_zoo.resnet.src.config import parse_config
    return parse_config


def main(argv) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__.strip())
        return 0
    before = set(sys.modules) if "ms_boost" not in sys.modules else None
    try:
        return _check(argv)
    finally:
        if before is not None and _light():  # forgotten: a real ``import ms_boost`` after the check starts clean
            _forget_light_imports(keep=before)


def _check(argv) -> int:
    parse_config = _parse_config()
    default = ROOT / "model_zoo" / "resnet" / "configs" / "resnet50_imagenet_momentum.yaml"
    try:
        # no --config but a checkpoint: the recipe its run manifest names, as eval.py/export.py take it (this
        # reads the checkpoint, so MindSpore is imported here)
        from model_zoo.resnet.src.recipe_lookup import checkpoint_folder_resolved, default_recipe
        argv = checkpoint_folder_resolved(argv, None)  # a run folder as the checkpoint: its newest, as eval.py takes
        recipe = default_recipe(argv, default, None)
        cfg = parse_config(argv, recipe)
        if touches_plan(cfg):  # the plan as the run builds it: ms_boost's configuration pieces check it
            if _light():
                try:
                    check = _light_plan_check()
                except ImportError:  # the plan's check came to need more of ms_boost: import it for real
                    check = None
                if check is not None:
                    check(cfg)
                    return 0
            cfg = _parse_config(light=False)(argv, recipe)
            check_boost_sections(cfg)
    except (ValueError, TypeError, OSError) as err:
        print(f"bad override (train.py and eval.py would stop on it): {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
