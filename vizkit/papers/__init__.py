"""One folder per paper: its layers, registered models, analyses, figures and explorers. The
generic core (hooks, analysis, metrics, viz, widgets, report) knows nothing of them; a new
paper mechanism is one new folder here."""

from . import cait as cait
from . import masks as masks
from . import refiner as refiner
from . import sot as sot

__all__ = ["cait", "refiner", "masks", "sot"]
