"""A saliency method is one file: dropped into `vizkit/methods/` (here, of a copy of the
package), it is registered, exported as ``vk.<function>``, listed in ``__all__``, run by
`compare_saliency` and among the defaults it asks for, with no other file touched."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import vizkit

PACKAGE = Path(vizkit.__file__).parent

THROWAWAY = '''
"""A throwaway method (tests/test_method_is_one_file.py): Grad-CAM with |gradient| weights."""

from ..analysis.gradcam_maps import cam_maps, channel_cam
from ..hooks.contract import analysis_contract
from .registry import saliency_method


@saliency_method("throwaway_cam", needs=("gradients", "layer"), default=True,
                 summary="channels weighted by their mean absolute gradient")
@analysis_contract
def throwaway_cam(model, x, target=None, layer=None):
    """Maps (B, h, w) of ``layer``."""
    return cam_maps(model, x, target, layer, "throwaway_cam",
                    lambda found, hm, x: channel_cam(found, found.grad.abs().mean((2, 3))))
'''

CHECK = """
import torch
import vizkit as vk

method = vk.methods.METHODS["throwaway_cam"]
assert vk.throwaway_cam is method.fn and "throwaway_cam" in vk.__all__
assert "throwaway_cam" in vk.methods.default_methods(True)
model = vk.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=3)
x = torch.randn(2, 3, 32, 32)
result = vk.throwaway_cam(model.eval(), x, target=1)
assert result.maps.shape == (2, 4, 4) and result.method == "throwaway_cam"
table = vk.compare_saliency(model, x, ["throwaway_cam", "random"], steps=2, progress=False)
assert table.methods == ["throwaway_cam", "random"]
print("ok")
"""


def test_a_method_file_dropped_into_the_package_is_registered_and_exported(tmp_path):
    copy = tmp_path / "vizkit"
    shutil.copytree(
        PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "zoo_models")
    )  # fmt: skip
    (copy / "zoo_models").symlink_to(PACKAGE / "zoo_models")
    (copy / "methods" / "throwaway_cam.py").write_text(textwrap.dedent(THROWAWAY))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # run from tmp_path: its copy first
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
    assert "throwaway_cam" not in vizkit.methods.METHODS  # the package itself is untouched
