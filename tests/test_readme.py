"""The README's Python example runs and shows what it says."""

import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_readme_example_runs():
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert tuple(scope["cache"].stack("attn.hook_pattern").shape) == (4, 64, 4, 65, 65)
    assert "blocks.3.norm1.hook_out_grad" in scope["grads"]
    assert not (scope["uniform_logits"] - scope["logits"]).abs().max() < 1e-6  # the edit acts
