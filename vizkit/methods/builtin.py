"""Every built-in saliency method, registered on import: the analyses' (rollout, gradient
rollout, class attention, Grad-CAM, captum's), the random baseline, and the methods of this
package."""

from .. import analysis, metrics  # noqa: F401  (register their methods)
from . import (
    ablationcam,
    attnlrp,
    eigencam,
    gradcam_pp,
    gradientshap,
    hirescam,
    layercam,
    legrad,
    scorecam,
    smoothgrad,
    transformer_attribution,
    xgradcam,
)

__all__ = [
    "ablationcam", "attnlrp", "eigencam", "gradcam_pp", "gradientshap", "hirescam", "layercam",
    "legrad", "scorecam", "smoothgrad", "transformer_attribution", "xgradcam",
]  # fmt: skip
