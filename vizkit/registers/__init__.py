"""Test-time registers (Jiang et al. 2025, "Vision Transformers Don't Need Trained
Registers"): the sparse MLP neurons that write a large ViT's high-norm artifact tokens
(`register_neurons`), their activations moved at test time into an extra token
(`test_time_register`), what that changes in the attention maps, the outputs and the
explanations (`register_effect`), and a small ViT with one such neuron planted to check the
pipeline on (`planted_register_vit`)."""

from .effect import RegisterEffect as RegisterEffect
from .effect import register_effect as register_effect
from .neurons import RegisterNeurons as RegisterNeurons
from .neurons import register_neurons as register_neurons
from .planted import PLANTED_NEURON as PLANTED_NEURON
from .planted import bright_patch_images as bright_patch_images
from .planted import planted_register_vit as planted_register_vit
from .register_token import TestTimeRegister as TestTimeRegister
from .register_token import test_time_register as test_time_register

__all__ = [
    "PLANTED_NEURON",
    "RegisterEffect",
    "RegisterNeurons",
    "TestTimeRegister",
    "bright_patch_images",
    "planted_register_vit",
    "register_effect",
    "register_neurons",
    "test_time_register",
]
