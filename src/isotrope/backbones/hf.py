"""Hugging Face transformer backbone: layer selection, prompts, device and dtype."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from isotrope.backbones.backends import DEFAULT_BACKEND, NUMERIC_CLASS, backend_fields, check_backend
from isotrope.backbones.base import TextKind, TokenBatch, TokenizedBackbone
from isotrope.backbones.context import context_average, unit_mean_norm
from isotrope.backbones.prepending import TokenPrepending, TPLayers, slot_template
from isotrope.backbones.resolve import default_max_length, resolve_model_path
from isotrope.pooling import last_real_position
from isotrope.transforms.base import NotFittedError

logger = logging.getLogger(__name__)

LayerSpec = int | list[int] | str


def parse_layers(layers: LayerSpec, num_hidden_layers: int) -> list[int]:
    """Hidden-state indices (HF indexing: 0 = embeddings, 1 = first transformer layer).

    ``"last"`` -> [L]; ``"first_last"`` -> [1, L]; an int or a list of ints (negative
    counts from the end) -> those indices, normalised to 0..L.
    """
    total = num_hidden_layers + 1
    if isinstance(layers, str):
        named = {"last": [num_hidden_layers], "first_last": [1, num_hidden_layers], "embeddings": [0]}
        if layers in named:
            return named[layers]
        try:
            layers = [int(part) for part in layers.split(",")]
        except ValueError:
            raise ValueError(f"unknown layers {layers!r}: use 'last', 'first_last', an index or a list") from None
    indices = [layers] if isinstance(layers, int) else list(layers)
    if not indices:
        raise ValueError("layers must name at least one hidden state")
    resolved = []
    for index in indices:
        if not -total <= index < total:
            raise ValueError(f"layer {index} is out of range for a model with {num_hidden_layers} layers")
        resolved.append(index % total)
    return resolved


def _pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


class HFBackbone(TokenizedBackbone):
    """Any ``AutoModel`` (encoder or decoder) by hub name or local path.

    ``prompt`` is a template containing ``{text}``; with a prompt the pooled
    position is the template's mask token (``[MASK]`` is replaced by the
    tokenizer's own) or, for tokenizers without one, the last token.
    ``query_prefix`` / ``document_prefix`` are prepended before templating.
    ``token_prepending`` (causal LMs only) inserts a slot before the text whose state is
    replaced by the last token's in decoder layers ``tp_layers`` (see ``prepending``).
    ``backend`` (``torch``, ``onnx``, ``onnx-int8``, ...: see :mod:`isotrope.backbones.backends`)
    picks the runtime; ``numeric`` is the class a saved config recorded, checked against it.
    """

    def __init__(
        self,
        model: str,
        layers: LayerSpec = "last",
        prompt: str | None = None,
        max_length: int | None = None,
        query_prefix: str = "",
        document_prefix: str = "",
        device: str = "auto",
        dtype: str = "auto",
        context: bool = False,
        token_prepending: bool = False,
        tp_layers: TPLayers = None,
        state: dict[str, np.ndarray] | None = None,
        backend: str = DEFAULT_BACKEND,
        numeric: str | None = None,
    ) -> None:
        if prompt is not None and "{text}" not in prompt:
            raise ValueError(f"prompt template must contain '{{text}}': {prompt!r}")
        self.backend = check_backend(backend)
        if numeric is not None and numeric != NUMERIC_CLASS[backend]:
            raise ValueError(
                f"backbone config records numeric class {numeric!r} but backend {backend!r} computes {NUMERIC_CLASS[backend]!r}"
            )
        self.model_name = model
        self.prompt = prompt
        self.query_prefix = query_prefix
        self.document_prefix = document_prefix
        path = resolve_model_path(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = _pick_device(device)
        self.dtype = _pick_dtype(dtype, self.device)
        if token_prepending and self.backend != DEFAULT_BACKEND:
            raise ValueError("token prepending hooks the torch model; use backend 'torch'")
        if self.backend == DEFAULT_BACKEND:
            self.model = AutoModel.from_pretrained(path, dtype=self.dtype).to(self.device).eval()
            config = self.model.config
        else:  # ONNX Runtime on a cached export; the torch model is loaded only to export it once
            from isotrope.backbones.onnx import OnnxHiddenStates

            self.model = None
            self.onnx = OnnxHiddenStates(path, self.backend, use_cuda=self.device.type == "cuda")
            config = self.onnx.config
        self.layers = parse_layers(layers, config.num_hidden_layers)
        self._drop_unused_layers(config.num_hidden_layers)
        self.max_length = (
            int(max_length) if max_length else default_max_length(path, getattr(self.tokenizer, "model_max_length", None))
        )
        self.context = bool(context)
        self.dim = int(config.hidden_size) * (2 if self.context else 1)
        state = state or {}
        self.context_table_ = state.get("context_table_")
        self.context_scale_ = state.get("context_scale_")
        if self.tokenizer.pad_token is None:  # decoders
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # -- token prepending: hooks on the model's own layers, a slot token in the template --
        self.prepending = TokenPrepending(self.model, self.tokenizer, tp_layers, model) if token_prepending else None
        self._template = slot_template(prompt) if self.prepending else prompt
        slot_ids = [self.prepending.slot_id] if self.prepending else []
        self._special_ids = np.array(sorted(set(self.tokenizer.all_special_ids) | set(slot_ids)), dtype=np.int64)

    # -- Backbone protocol -----------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def vocabulary(self) -> list[str]:
        tokens = self.tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
        return [token if token is not None else "" for token in tokens]

    def special_ids(self) -> np.ndarray:
        return self._special_ids

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        encoded = self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=self.max_length)
        return encoded["input_ids"]

    def get_config(self) -> dict[str, Any]:
        config = {
            "type": "hf",
            "model": self.model_name,
            "layers": self.layers,
            "prompt": self.prompt,
            "max_length": self.max_length,
            "query_prefix": self.query_prefix,
            "document_prefix": self.document_prefix,
            "context": self.context,
            **backend_fields(self.backend),
        }
        if self.prepending:  # only when on: configs (and fingerprints) without it are unchanged
            config.update(token_prepending=True, tp_layers=self.prepending.layers)
        return config

    def get_state(self) -> dict[str, np.ndarray]:
        if not self.context or self.context_table_ is None:
            return {}
        assert self.context_scale_ is not None  # computed and loaded together with context_table_
        return {"context_table_": self.context_table_, "context_scale_": self.context_scale_}

    @property
    def needs_fit(self) -> bool:
        """With ``context=True`` ("BERT+Avg"), the context-averaged table comes from the fit corpus."""
        return self.context and self.context_table_ is None

    def fit(self, texts: Sequence[str], show_progress: bool = False) -> HFBackbone:
        if self.context:
            self.context_table_ = None  # forward yields the contextual states alone while fitting
            self._fitting = True
            try:
                table, mean_norm = context_average(self, texts)
            finally:
                self._fitting = False
            self.context_table_ = unit_mean_norm(table)
            self.context_scale_ = np.array([1.0 / mean_norm], dtype=np.float32)
        return self

    def tokenize(self, texts: Sequence[str], kind: TextKind = "document") -> tuple[list[list[int]], list[list[int]]]:
        """Token ids (with special tokens, truncated to max_length) and special-token masks."""
        prefix = self.query_prefix if kind == "query" else self.document_prefix
        texts = [prefix + text for text in texts]
        if self._template is not None:
            texts = [self._apply_prompt(text) for text in texts]
        encoded = self.tokenizer(texts, truncation=True, max_length=self.max_length, return_special_tokens_mask=True)
        if self.prepending:  # the slot is a special token: never weighted as a word
            slot = self.prepending.slot_id
            return encoded["input_ids"], [
                [int(flag or token == slot) for token, flag in zip(ids, flags)]
                for ids, flags in zip(encoded["input_ids"], encoded["special_tokens_mask"])
            ]
        return encoded["input_ids"], encoded["special_tokens_mask"]

    @torch.inference_mode()
    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, special_mask: np.ndarray) -> TokenBatch:
        """Run the model on one padded batch; states are the mean of the chosen layers, float32."""
        states = (
            self._torch_states(input_ids, attention_mask)
            if self.model is not None
            else self.onnx.states(input_ids, attention_mask, self.layers)
        )
        if self.context and not getattr(self, "_fitting", False):
            if self.context_table_ is None or self.context_scale_ is None:
                raise NotFittedError(f"{self.model_name}+context: the context table is computed by fit(texts) first")
            states = np.concatenate([states * self.context_scale_[0], self.context_table_[input_ids]], axis=2)
        return TokenBatch(
            states=states,
            input_ids=input_ids,
            attention_mask=attention_mask,
            special_mask=special_mask,
            target_index=self._target_index(input_ids, attention_mask) if self.prompt is not None else None,
        )

    def _torch_states(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        inputs = {
            "input_ids": torch.from_numpy(input_ids).to(self.device),
            "attention_mask": torch.from_numpy(attention_mask.astype(np.int64)).to(self.device),
        }
        with self.prepending.applied(inputs) if self.prepending else nullcontext():
            if self._last_only:
                states = self.model(**inputs).last_hidden_state.float()
            else:
                hidden = self.model(**inputs, output_hidden_states=True).hidden_states
                states = torch.stack([hidden[index].float() for index in self.layers]).mean(dim=0)
        return states.cpu().numpy()

    def _drop_unused_layers(self, num_hidden_layers: int) -> None:
        """Encoders whose deepest used layer is below the top skip computing the layers above it.

        Only BERT-style stacks (``model.encoder.layer``, no final norm) are cut, where the
        kept hidden states are unchanged by the cut.
        """
        deepest = max(self.layers)
        layer_list = getattr(getattr(self.model, "encoder", None), "layer", None)
        if deepest < num_hidden_layers and isinstance(layer_list, torch.nn.ModuleList):
            self.model.encoder.layer = layer_list[:deepest]
            logger.debug("computing %d of %d layers", deepest, num_hidden_layers)
        self._last_only = self.layers == [num_hidden_layers]

    # -- prompts ------------------------------------------------------------------
    def _apply_prompt(self, text: str) -> str:
        """Fill the template, truncating the text (not the template) to fit max_length."""
        assert self._template is not None, "prompts are applied only when a template is set"
        template = self._template.replace("[MASK]", self.tokenizer.mask_token or "[MASK]")
        overhead = len(self.tokenizer(template.replace("{text}", ""))["input_ids"])
        budget = max(self.max_length - overhead, 1)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if len(encoded["input_ids"]) > budget:
            text = text[: encoded["offset_mapping"][budget - 1][1]]
        return template.replace("{text}", text)

    def _target_index(self, input_ids: np.ndarray, attention: np.ndarray) -> np.ndarray:
        mask_id = self.tokenizer.mask_token_id
        if mask_id is not None and "[MASK]" in (self.prompt or ""):
            is_mask = input_ids == mask_id
            if not is_mask.any(axis=1).all():
                raise ValueError("the prompt's mask token was truncated away; raise max_length")
            return is_mask.argmax(axis=1)
        return last_real_position(attention)
