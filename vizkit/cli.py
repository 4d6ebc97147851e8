"""The ``vizkit`` command."""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import torch
from torch import Tensor, nn

from . import zoo
from ._version import __version__
from .analysis import normalized_entropy
from .analysis.cka_kernels import KERNELS
from .analysis.representations import TOKEN_MODES
from .datasets import model_batch
from .hooks import HookedModel
from .hooks.inputs import check_device
from .hooks.names import collapsed_names
from .runs import write_atomically, write_json

__all__ = ["main"]

DEFAULT_MODEL = "vit_tiny_shapes"


def _is_pattern(name: str) -> bool:
    return name.endswith("attn.hook_pattern")


def info(args: argparse.Namespace) -> int:
    """Load a zoo or timm model, capture every attention map on a sample batch, print names,
    shapes and a per-layer attention-entropy table."""
    model, card = zoo.load(args.model, pretrained=args.pretrained, checkpoint=args.checkpoint)
    batch = model_batch(model, None, args.batch, card)
    images, source = batch.images, batch.source
    model, images = model.to(args.device), images.to(args.device)
    hm = HookedModel(model)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    if "test_accuracy" in card:
        weights = f"zoo, {card['test_accuracy']:.1%} test accuracy on {card['data']['name']}"
    elif card["weights"] == "random":
        weights = "random weights: expect near-uniform attention"
    else:
        weights = card["weights"]
    print(f"model   {args.model} ({params:.1f}M parameters, {weights})")
    print(f"input   {source}, shape {tuple(images.shape)}")
    layout = hm.token_layout(tuple(images.shape[-2:]))
    if layout is not None:
        print(
            f"tokens  {layout.num_prefix_tokens} prefix + {layout.grid[0]}x{layout.grid[1]} "
            f"patches = {layout.num_tokens}"
        )

    names = hm.hook_names()
    generic = [n for n in names if n.endswith(".hook_out")]
    shown = names if args.all_names else [n for n in names if n not in generic]
    print(
        f"\n{len(names)} hook names ({len(generic)} '<module>.hook_out' "
        f"{'included' if args.all_names else 'not listed; --all-names lists them'}):"
    )
    for group, first in collapsed_names(shown):
        print(f"  {group:<48} {hm.tap(first).shape}")

    if not any(_is_pattern(n) for n in names):
        print("\nThis model has no attention patterns vizkit can capture.")
        return 0
    start = time.perf_counter()
    with torch.no_grad():
        logits, cache = hm.run_with_cache(images, names=_is_pattern)
    elapsed = time.perf_counter() - start
    print(
        f"\ncaptured {len(cache)} attention maps in {elapsed:.2f} s; logits {tuple(logits.shape)}"
    )
    print(
        "\nattention entropy per layer (normalized: 1 = uniform over keys, 0 = one key),\n"
        "averaged over images and queries:"
    )
    print(f"  {'name':<40} {'shape':<20} {'mean':>6} {'min head':>9} {'max head':>9}")
    for name, pattern in cache.items():
        per_head = normalized_entropy(pattern).mean(dim=(0, 2))  # (B, H, Nq) -> (H,)
        print(
            f"  {name:<40} {str(tuple(pattern.shape)):<20} {per_head.mean():6.3f} "
            f"{per_head.min():9.3f} {per_head.max():9.3f}"
        )
    return 0


def train_command(args: argparse.Namespace) -> int:
    """Train recipes into the zoo folder (replacing a model there only with ``--force``) on
    ``--device``, ``--jobs`` at a time, and print each card's headline as its run ends."""
    from .train.sweep import run_recipes

    def headline(card: dict) -> None:
        print(
            f"{card['name']}: test accuracy {card['test_accuracy']:.4f}, "
            f"{card['parameters'] / 1e6:.2f}M parameters, "
            f"{card['training_seconds'] / 60:.1f} min",
            flush=True,
        )

    stop_after = None if args.stop_after is None else args.stop_after * 60
    run_recipes(args.recipe, jobs=args.jobs, epochs=args.epochs, overwrite=args.force,
                device=args.device, stop_after=stop_after, skip_trained=args.skip_trained,
                report=headline)  # fmt: skip
    return 0


def cka_command(args: argparse.Namespace) -> int:
    """Layer x layer CKA of a model (or two) on sample images; under ``torchrun`` every process
    takes every WORLD_SIZE-th batch and the accumulators are summed, so the matrix is the one a
    single process computes."""
    import torch.distributed as dist

    from .analysis import cka_matrix

    world, rank = _init_distributed()
    try:
        device = args.device or (
            f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu"
        )
        model, card = zoo.load(args.model)
        model_b = zoo.load(args.model_b)[0].to(device) if args.model_b else None
        images = model_batch(model, args.data, args.samples, card).images
        batches = [b for i, b in enumerate(images.split(args.batch_size)) if i % world == rank]
        result = cka_matrix(
            model.to(device),
            batches,
            model_b=model_b,
            tokens=args.tokens,
            kernel=args.kernel,
            unbiased=not args.biased,
            progress=rank == 0,
        )
    finally:
        if world > 1:
            dist.destroy_process_group()
    if rank == 0:
        print(f"CKA {result.options}")
        for name, row in zip(result.layers_a, result.matrix.tolist(), strict=True):
            print(f"  {name:<32} " + " ".join(f"{v:5.2f}" for v in row))
        if args.out:
            write_json(args.out, result.to_dict())
            print(f"wrote {args.out}")
    return 0


def _init_distributed() -> tuple[int, int]:
    """(world size, rank); joins the process group when launched by torchrun."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return world, int(os.environ.get("RANK", 0))


def _sections(text: str) -> str | list[str]:
    """--sections: "default", "all" or comma-separated names, checked against the report's."""
    from .report import chosen_sections

    chosen = text if text in ("default", "all") else [t.strip() for t in text.split(",")]
    try:
        chosen_sections(chosen)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return chosen


def _sae_folder(text: str) -> str:
    """--sae: a folder holding sae.json (what vk.train_sae writes with checkpoint=)."""
    if not (Path(text) / "sae.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{text} holds no sparse autoencoder (no sae.json); pass the folder given to "
            "vk.train_sae(..., checkpoint=FOLDER)"
        )
    return text


def report_command(args: argparse.Namespace) -> int:
    """Write the HTML report and print where it is."""
    from .report import build_report

    start = time.perf_counter()
    page = build_report(args.model, args.data, args.n, args.out, args.checkpoint, args.device,
                        sections=args.sections, sae=args.sae)  # fmt: skip
    print(f"wrote {page.resolve()} in {time.perf_counter() - start:.1f} s")
    return 0


def evaluate_command(args: argparse.Namespace) -> int:
    """Score saliency methods over the Shapes sample (or its first --limit images), appending
    to --out as it goes (a second run resumes), and print the table; under ``torchrun`` each
    process takes its share of the batches and the first prints the gathered table."""
    import torch.distributed as dist
    from torch.utils.data import TensorDataset

    from .datasets import load_sample
    from .metrics import evaluate

    world, rank = _init_distributed()
    try:
        model, _ = zoo.load(args.model, checkpoint=args.checkpoint)
        data = TensorDataset(*(t[: args.limit] for t in load_sample()))
        _require_sample_size(model, data.tensors[0], args.model)
        methods = args.methods if args.methods else "default"
        table = evaluate(model.to(args.device), data, methods, args.metrics or "all", args.out,
                         args.batch_size, progress=rank == 0)  # fmt: skip
    finally:
        if world > 1:
            dist.destroy_process_group()
    if rank == 0:
        print(table.to_markdown())
        for name, note in table.notes.items():
            print(f"{name}: {note}", file=sys.stderr)
    return 0


def _require_sample_size(model: nn.Module, images: Tensor, name: str) -> None:
    """Refuse, with what works on the command line, a model that cannot take the Shapes
    sample's images (B, 3, 32, 32)."""
    from .hooks.inputs import check_images

    try:
        check_images(model, images[:1])
    except ValueError as error:
        raise ValueError(
            f"vizkit evaluate scores the Shapes sample ({images.shape[-2]}x{images.shape[-1]} "
            f"images), which {name} does not take: {str(error).split(';')[0]}. Pass a model "
            "of the sample (e.g. --model vit_tiny_shapes; vizkit zoo list), or evaluate your "
            "own images from Python: x, _, _ = vk.datasets.load_images(files, model); "
            "vk.evaluate(model, (x, labels))."
        ) from error


def zoo_list() -> int:
    """Print the zoo as a table."""
    from . import zoo

    names = zoo.list_models()
    if not names:
        print(f"The zoo at {zoo.models_dir()} is empty.")
        return 0
    print(f"{'name':<22} {'architecture':<24} {'data':<8} {'accuracy':>8} {'params':>8}")
    for name in names:
        c = zoo.card(name)
        print(
            f"{name:<22} {c['architecture']:<24} {c['data']['name']:<8} "
            f"{c['test_accuracy']:8.4f} {c['parameters'] / 1e6:7.2f}M"
        )
    return 0


def coverage_command(out: Path, families: list[str] | None) -> int:
    """Run the coverage walk and write its Markdown table to ``out``."""
    from .coverage import coverage_markdown, run_coverage, run_library_coverage

    rows = run_coverage(families)
    libraries = run_library_coverage() if families is None else {}
    write_atomically(out, coverage_markdown(rows, libraries))
    every = rows + [row for library_rows in libraries.values() for row in library_rows]
    errors = [(r.family, n) for r in every for n, (s, _) in r.results.items() if s == "error"]
    print(f"wrote {out} ({len(every)} families; {len(errors)} errors)")
    return 1 if errors else 0


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, ``vizkit <cmd>: error: ...``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    value = int(text) if text.strip().isdecimal() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1; got {text!r}")
    return value


def _minutes(text: str) -> float:
    """argparse type: a number of minutes >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a number of minutes >= 0; got {text!r}")
    return value


def _device(text: str) -> str:
    """argparse type: a device this machine has (cpu, cuda, cuda:N, mps)."""
    try:
        check_device(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _output_file(text: str) -> Path:
    """argparse type: a file to write (replaced if there) in an existing, writable folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; pass a file name in it")
    _check_writable(path.parent, text)
    return path


def _output_folder(text: str) -> Path:
    """argparse type: a folder to write into (made if absent) in an existing, writable one."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text} is a file; pass a folder (the report is <folder>/index.html)"
        )
    _check_writable(path if path.is_dir() else path.parent, text)
    return path


def _check_writable(folder: Path, text: str) -> None:
    """``folder`` (where ``--out text`` goes) exists and can be written."""
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(
            f"cannot write {text}: there is no folder {folder}; create it or pick another path"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"cannot write {text}: the folder {folder} is not writable; pick another path"
        )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vizkit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"vizkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("info", help="hook names, attention shapes and entropy of a model")
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"zoo or timm name (default {DEFAULT_MODEL})"
    )
    p.add_argument("--batch", type=_positive_int, default=4, help="sample images (default 4)")
    p.add_argument("--pretrained", action="store_true", help="load timm's pretrained weights")
    p.add_argument("--checkpoint", help="local checkpoint file to load")
    p.add_argument("--all-names", action="store_true", help="also list every '.hook_out' name")
    p.add_argument("--device", type=_device, default="cpu", help="default %(default)s")
    t = commands.add_parser("train", help="train a recipe; writes checkpoint and card to models/")
    t.add_argument(
        "recipe", nargs="+", help="shipped recipe names (e.g. vit_tiny_shapes) or JSON paths"
    )
    t.add_argument(
        "--epochs", type=_positive_int, help="override the recipe's epochs (shortened runs)"
    )
    t.add_argument("--force", action="store_true", help="replace the model if the zoo has it")
    t.add_argument("--device", type=_device, default="cpu", help="default %(default)s (or cuda)")
    t.add_argument(
        "--jobs", type=_positive_int, default=1, help="runs side by side, one process each"
    )
    t.add_argument(
        "--stop-after", type=_minutes, help="start no run after this many minutes (a sweep)"
    )
    t.add_argument(
        "--skip-trained", action="store_true", help="leave out the recipes the zoo has (resume)"
    )
    c = commands.add_parser(
        "cka", help="layer x layer CKA of a model or two (runs under torchrun too)"
    )
    c.add_argument("--model", default=DEFAULT_MODEL, help="zoo or timm name")
    c.add_argument("--model-b", help="second model (columns); default: --model against itself")
    c.add_argument("--data", choices=["shapes", "digits"], help="default: the model's data")
    c.add_argument("--samples", type=_positive_int, default=512, help="test images (default 512)")
    c.add_argument("--batch-size", type=_positive_int, default=32, help="minibatch (default 32)")
    c.add_argument("--tokens", default="flatten", choices=TOKEN_MODES, help="default flatten")
    c.add_argument("--kernel", default="linear", choices=KERNELS, help="default linear")
    c.add_argument("--biased", action="store_true", help="biased HSIC per batch")
    c.add_argument("--out", type=_output_file, help="write the result as JSON")
    c.add_argument("--device", type=_device, help="default: cuda:$LOCAL_RANK if any, else cpu")
    r = commands.add_parser("report", help="one HTML page with every analysis of a model")
    r.add_argument(
        "--model", default=DEFAULT_MODEL,
        help="zoo name, timm name or a zoo-style .safetensors path (default %(default)s)",
    )  # fmt: skip
    r.add_argument("--checkpoint", help="your .safetensors weights for a timm --model")
    r.add_argument("--data", help="shapes, digits or an image folder (default: the model's data)")
    r.add_argument("--n", type=_positive_int, default=8, help="images to analyse (default 8)")
    r.add_argument(
        "--out", type=_output_folder, default="report", help="output folder (default report/)"
    )
    r.add_argument("--device", type=_device, default="cpu", help="default %(default)s")
    r.add_argument(
        "--sections", type=_sections, default="default",
        help="comma-separated sections, 'all', or 'default' (every one but the trust checks, "
        "'evaluation', which cost several times the rest)",
    )  # fmt: skip
    r.add_argument(
        "--sae", type=_sae_folder,
        help="a sparse autoencoder's folder (vk.train_sae(..., checkpoint=FOLDER)): adds the "
        "features section",
    )  # fmt: skip
    v = commands.add_parser(
        "coverage", help="which analysis works on which timm family (writes docs/coverage.md)"
    )
    v.add_argument(
        "--out", type=_output_file, default="docs/coverage.md", help="default %(default)s"
    )
    v.add_argument("--family", action="append", help="only these timm modules (repeatable)")
    e = commands.add_parser(
        "evaluate", help="score saliency methods over the Shapes sample (resumable with --out)"
    )
    e.add_argument("--model", default=DEFAULT_MODEL, help="zoo or timm name (default %(default)s)")
    e.add_argument("--checkpoint", help="your .safetensors weights for a timm --model")
    e.add_argument("--methods", nargs="+", help="saliency methods (default: the registry's)")
    e.add_argument("--metrics", nargs="+", help="metrics (default: every one that applies)")
    e.add_argument("--limit", type=_positive_int, help="the first N images of the sample")
    e.add_argument("--batch-size", type=_positive_int, default=16, help="default %(default)s")
    e.add_argument("--out", type=Path, help="JSON-lines file to append to; a rerun resumes it")
    e.add_argument("--device", type=_device, default="cpu", help="default %(default)s")
    z = commands.add_parser("zoo", help="the shipped models")
    z.add_argument("action", choices=["list"])
    return parser


def _show_warning(command: str, message: Warning | str, *_: object) -> None:
    """`warnings.showwarning` of the command: one line on stderr."""
    print(f"vizkit {command}: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a user's mistake (bad option, file, model, recipe) is one line on stderr
    and exit status 2."""
    args = _parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = functools.partial(_show_warning, args.command)
            return _run(args)
    except (ValueError, KeyError, TypeError, RuntimeError, OSError) as err:
        hint = ""
        if getattr(args, "pretrained", False) and "Hub" in str(err):
            hint = (
                " (pretrained weights come from the Hugging Face Hub; offline, pass --checkpoint)"
            )
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"vizkit {args.command}: error: {message}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # one line per process, not a traceback
        resumable = args.command == "evaluate" and args.out is not None
        resume = "; rerun the same command to resume" if resumable else ""
        print(f"vizkit {args.command}: interrupted{resume}.", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "train":
        return train_command(args)
    if args.command == "zoo":
        return zoo_list()
    if args.command == "cka":
        return cka_command(args)
    if args.command == "report":
        return report_command(args)
    if args.command == "coverage":
        return coverage_command(args.out, args.family)
    if args.command == "evaluate":
        return evaluate_command(args)
    return info(args)


if __name__ == "__main__":
    sys.exit(main())
