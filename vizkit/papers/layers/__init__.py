"""What vizkit's attention layers (the papers' mechanisms, `vizkit.papers`) share with timm's
`Attention`: the options timm's blocks pass and the query/key normalizations."""

from .timm_attention import drop_block_options as drop_block_options
from .timm_attention import query_key_norms as query_key_norms

__all__ = ["drop_block_options", "query_key_norms"]
