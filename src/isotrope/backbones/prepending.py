"""Token Prepending (Fu et al., ACL 2025) for causal language models, by forward pre-hooks.

A slot token (``<PST>``) is inserted before the sentence, after the prompt's prefix. At the
input of each decoder layer in ``[start, end)`` the slot's state is overwritten by the last
token's state (the previous layer's output), so that under causal attention every sentence
token can attend to a summary of the whole sentence. The hooks sit on the model's own
decoder layers; no model code is copied, so any Hugging Face causal LM with a discoverable
layer list works (GPT-2, LLaMA, Qwen, Mistral, ...).

Layer indices follow the paper and Hugging Face's ``hidden_states``: the input of decoder
layer ``i`` is hidden state ``i`` (0 = embeddings), so ``--tp-layers 1:8`` replaces the slot
in hidden states 1..7.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AddedToken

logger = logging.getLogger(__name__)

SLOT_TOKEN = "<PST>"
#: quotes that open the sentence in a template; the slot goes before them, as in the paper
_OPENING_QUOTES = re.compile(r"[\"'\u201c\u2018\u00ab]*\{text\}")

TPLayers = str | Sequence[int] | None


def default_tp_layers(num_layers: int) -> tuple[int, int]:
    """From layer 1 to about a quarter of the depth: 1:8 on 32 layers (the paper's code uses 1:7 on LLaMA-2-7B)."""
    return 1, max(2, num_layers // 4)


def parse_tp_layers(layers: TPLayers, num_layers: int) -> tuple[int, int]:
    """``"START:END"`` or a ``(start, end)`` pair -> a checked half-open range of decoder layers."""
    span: tuple[int, ...]
    if layers is None:
        span = default_tp_layers(num_layers)
    elif isinstance(layers, str):
        first, sep, last = layers.partition(":")
        try:
            span = (int(first), int(last)) if sep else ()
        except ValueError:
            span = ()
        if not span:
            raise ValueError(f"tp_layers {layers!r}: expected START:END, e.g. 1:8")
    else:
        span = tuple(int(value) for value in layers)
        if len(span) != 2:
            raise ValueError(f"tp_layers {layers!r}: expected two layer indices (start, end)")
    start, end = span
    if not 0 <= start < end <= num_layers:
        raise ValueError(f"tp_layers {start}:{end} must satisfy 0 <= START < END <= {num_layers} (the model's layers)")
    return start, end


def slot_template(prompt: str | None) -> str:
    """The prompt with the slot before the sentence (before its opening quote): the paper's
    ``This sentence : <PST> "{text}" means in one word:"``; no prompt -> ``<PST> {text}``."""
    template = prompt if prompt is not None else "{text}"
    match = _OPENING_QUOTES.search(template)
    if match is None:
        raise ValueError(f"prompt template must contain '{{text}}': {template!r}")
    return f"{template[: match.start()]}{SLOT_TOKEN} {template[match.start() :]}"


def find_layer_list(model: torch.nn.Module, num_layers: int) -> torch.nn.ModuleList:
    """The model's decoder layers: the outermost ModuleList with one entry per hidden layer
    (``layers`` in LLaMA/Qwen/Mistral, ``h`` in GPT-2, ``decoder.layers`` in OPT, ...)."""
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return module
    raise ValueError(f"token prepending: no list of {num_layers} decoder layers found in {type(model).__name__}")


def _probe_ids(tokenizer: Any, vocab_rows: int) -> list[int]:
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(min(vocab_rows, 64)) if i not in special]
    if len(ids) < 4:
        raise ValueError("token prepending: the tokenizer has too few ordinary tokens to check causality")
    return ids[:4]


@torch.inference_mode()
def check_causal(model: torch.nn.Module, tokenizer: Any, name: str) -> None:
    """One-line error unless the model is causal: changing the last token must leave the earlier
    states unchanged (an encoder such as BERT attends in both directions)."""
    a, b, c, d = _probe_ids(tokenizer, model.get_input_embeddings().num_embeddings)
    parameter = next(model.parameters())
    states = [
        model(input_ids=torch.tensor([[a, b, *[tail] * 4]], device=parameter.device)).last_hidden_state[0, :2] for tail in (c, d)
    ]
    change = (states[0].float() - states[1].float()).abs().max() / states[0].float().abs().max().clamp_min(1e-6)
    if change > (1e-5 if parameter.dtype == torch.float32 else 1e-2):  # causal: the same up to rounding
        raise ValueError(f"token prepending needs a causal (decoder) language model; {name} attends in both directions")


def add_slot_token(model: Any, tokenizer: Any) -> int:
    """Add ``<PST>`` to the tokenizer (a special, never split token) and give it the mean input embedding
    (deterministic, where the paper draws a random vector); returns its id."""
    known = len(tokenizer)
    tokenizer.add_tokens([AddedToken(SLOT_TOKEN, special=True, normalized=False)], special_tokens=True)
    slot_id = tokenizer.convert_tokens_to_ids(SLOT_TOKEN)
    embeddings = model.get_input_embeddings()
    if slot_id >= embeddings.num_embeddings:
        model.resize_token_embeddings(slot_id + 1, mean_resizing=False)
        embeddings = model.get_input_embeddings()
    with torch.no_grad():
        embeddings.weight[slot_id] = embeddings.weight[: min(known, slot_id)].float().mean(dim=0).to(embeddings.weight.dtype)
    return slot_id


def slot_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, slot_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the slot's position (its first occurrence) and the last real token's (any padding side)."""
    is_slot = (input_ids == slot_id) & attention_mask.bool()
    if not bool(is_slot.any(dim=1).all()):
        raise ValueError("token prepending: a text lost its slot token to truncation; raise max_length")
    width = attention_mask.shape[1]
    last = width - 1 - attention_mask.flip(dims=[1]).long().argmax(dim=1)
    return is_slot.long().argmax(dim=1), last


class TokenPrepending:
    """Hooks the decoder layers ``[start, end)`` of ``model``; active only inside :meth:`applied`."""

    def __init__(self, model: Any, tokenizer: Any, layers: TPLayers = None, name: str = "the model") -> None:
        num_layers = int(model.config.num_hidden_layers)
        check_causal(model, tokenizer, name)
        self.layer_list = find_layer_list(model, num_layers)
        self.start, self.end = parse_tp_layers(layers, num_layers)
        self.slot_id = add_slot_token(model, tokenizer)
        self._positions: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        logger.debug("token prepending on %s: layers %d:%d, slot id %d", name, self.start, self.end, self.slot_id)

    @property
    def layers(self) -> list[int]:
        """``[start, end]`` as saved in the backbone config."""
        return [self.start, self.end]

    @contextmanager
    def applied(self, inputs: dict[str, torch.Tensor]) -> Iterator[None]:
        """Run the model on ``inputs`` (input_ids, attention_mask) inside this block to prepend.

        Left-padded batches also get ``position_ids`` counted over real tokens, so that a row's
        vectors do not depend on the padding it was batched with.
        """
        mask = inputs["attention_mask"]
        slot, last = slot_positions(inputs["input_ids"], mask, self.slot_id)
        self._positions = (torch.arange(mask.shape[0], device=mask.device), slot, last)
        if not bool(mask[:, 0].all()):
            inputs["position_ids"] = (mask.long().cumsum(dim=1) - 1).clamp_min(0)
        handles = [
            layer.register_forward_pre_hook(self._replace_slot, with_kwargs=True)
            for layer in self.layer_list[self.start : self.end]
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._positions = None

    def _replace_slot(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        """The slot's state at this layer's input <- the last token's (in place, so the model's
        ``hidden_states`` show the replaced slot, as in the reference implementation)."""
        hidden = args[0] if args else kwargs["hidden_states"]
        assert self._positions is not None, "the hook runs only inside a forward pass with positions set"
        rows, slot, last = self._positions
        hidden[rows, slot] = hidden[rows, last]
