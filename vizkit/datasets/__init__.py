"""Data: generated shapes with masks (also as a segmentation set, `ShapeMasks`), real images
that ship inside packages, the user's own images (`load_images`: files, folders, PIL images,
arrays) and videos (`load_video`)."""

from .batch import DATA_SOURCES as DATA_SOURCES
from .batch import Batch as Batch
from .batch import model_batch as model_batch
from .digits import Digits as Digits
from .digits import digit_images as digit_images
from .image_folder import ImageFolder as ImageFolder
from .model_input import Preprocessing as Preprocessing
from .model_input import model_preprocessing as model_preprocessing
from .shape_clips import CLIP_CLASSES as CLIP_CLASSES
from .shape_clips import ShapeClips as ShapeClips
from .shape_clips import render_shape_clips as render_shape_clips
from .shape_clips import shape_clips as shape_clips
from .shape_masks import MASK_CLASSES as MASK_CLASSES
from .shape_masks import ShapeMasks as ShapeMasks
from .shapes import SHAPE_CLASSES as SHAPE_CLASSES
from .shapes import Shapes as Shapes
from .shapes import counterfactual_shapes as counterfactual_shapes
from .shapes import load_sample as load_sample
from .shapes import render_shapes as render_shapes
from .user_images import LoadedImages as LoadedImages
from .user_images import load_images as load_images
from .user_videos import LoadedVideos as LoadedVideos
from .user_videos import load_video as load_video

__all__ = [
    "CLIP_CLASSES",
    "DATA_SOURCES",
    "MASK_CLASSES",
    "SHAPE_CLASSES",
    "Batch",
    "Digits",
    "ImageFolder",
    "LoadedImages",
    "LoadedVideos",
    "Preprocessing",
    "ShapeClips",
    "ShapeMasks",
    "Shapes",
    "counterfactual_shapes",
    "digit_images",
    "load_images",
    "load_sample",
    "load_video",
    "model_preprocessing",
    "model_batch",
    "render_shape_clips",
    "render_shapes",
    "shape_clips",
]
