"""Token Prepending on tiny random decoders (GPT-2 and LLaMA), against the plain model run layer by layer."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from conftest import PUNCTUATION, WORDS, make_sentences
from isotrope.backbones.hf import HFBackbone
from isotrope.backbones.prepending import SLOT_TOKEN, find_layer_list, parse_tp_layers, slot_template
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder
from isotrope.evaluate.cache import CachedBackbone
from isotrope.pooling import pool

PROMPT = 'This sentence : "{text}" means in one word:"'
TEXTS = ["the cat sees a small bird .", "dogs run", "she loves the music of the river and the rain in the city !", "a red car"]
ARCHS = ("gpt2", "llama")
DECODER_VOCAB = ["<unk>", "<s>", "</s>", *dict.fromkeys([*WORDS, "one", *PUNCTUATION])]


def _tokenizer(bos: bool):
    """A word-level tokenizer (lower-cased, punctuation split off); LLaMA-style ones prepend <s>."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(DECODER_VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", model_max_length=128
    )


def _randomise_norms(model: torch.nn.Module) -> None:
    """Fresh norms have gain 1 and bias 0; random ones make the states less degenerate, as in a trained model."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or "ln_" in name:
                parameter.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)


@pytest.fixture(scope="module", params=ARCHS)
def decoder_path(request, tmp_path_factory) -> str:
    """A random 3-layer causal LM (GPT-2 or LLaMA, hidden 32) and its tokenizer saved in a folder."""
    from transformers import GPT2Config, GPT2Model, LlamaConfig, LlamaModel

    arch = request.param
    size = len(DECODER_VOCAB)
    if arch == "gpt2":
        config = GPT2Config(vocab_size=size, n_positions=128, n_embd=32, n_layer=3, n_head=4, bos_token_id=1, eos_token_id=2)
        model_class = GPT2Model
    else:
        config = LlamaConfig(
            vocab_size=size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            bos_token_id=1,
            eos_token_id=2,
        )
        model_class = LlamaModel
    torch.manual_seed(0)
    model = model_class(config).eval()
    _randomise_norms(model)
    folder = tmp_path_factory.mktemp(f"tiny-{arch}")
    model.save_pretrained(folder)
    _tokenizer(bos=arch == "llama").save_pretrained(folder)
    return str(folder)


def _backbone(path: str, **options) -> HFBackbone:
    return HFBackbone(path, device="cpu", dtype="float32", **options)


# -- the reference: the plain model, one layer at a time --------------------------------
def _single_layer_model(model: torch.nn.Module, index: int) -> torch.nn.Module:
    """A copy of ``model`` that runs only decoder layer ``index`` on given ``inputs_embeds`` (no position
    embedding added, no final norm), through the model's own forward."""
    single = copy.deepcopy(model)
    layers = single.h if hasattr(single, "h") else single.layers
    kept = torch.nn.ModuleList([layers[index]])
    if hasattr(single, "h"):
        single.h, single.ln_f = kept, torch.nn.Identity()
        single.wpe.weight.data.zero_()
    else:
        single.layers, single.norm = kept, torch.nn.Identity()
    single.config.num_hidden_layers = 1
    return single


@torch.no_grad()
def reference_states(path: str, ids: list[int], slot: int, start: int, end: int) -> list[torch.Tensor]:
    """Hidden states 0..L of one text under Token Prepending, computed with the plain model alone:
    entry i is layer i's input (slot replaced by the last token's state when start <= i < end)."""
    model = AutoModel.from_pretrained(path).eval()
    table = model.get_input_embeddings().weight
    slot_vector = table.mean(dim=0)  # the slot's embedding: the mean of the model's token embeddings
    embeds = torch.stack([slot_vector if position == slot else table[token] for position, token in enumerate(ids)])
    first = model(inputs_embeds=embeds[None], output_hidden_states=True).hidden_states[0][0]  # adds GPT-2's wpe
    states, hidden = [], first.clone()
    num_layers = model.config.num_hidden_layers
    for index in range(num_layers):
        if start <= index < end:
            hidden = hidden.clone()
            hidden[slot] = hidden[-1]
        states.append(hidden)
        single = _single_layer_model(model, index)
        hidden = single(inputs_embeds=hidden[None], output_hidden_states=True, use_cache=False).hidden_states[-1][0]
    final_norm = model.ln_f if hasattr(model, "ln_f") else model.norm
    states.append(final_norm(hidden))
    return states


@pytest.mark.parametrize(("start", "end"), [(1, 3), (0, 2)])
def test_slot_takes_the_previous_layers_last_token_state(decoder_path, start, end):
    backbone = _backbone(decoder_path, prompt=PROMPT, token_prepending=True, tp_layers=(start, end))
    text = TEXTS[0]
    (ids,), _ = backbone.tokenize([text])
    slot = ids.index(backbone.prepending.slot_id)
    assert backbone.tokenizer.convert_ids_to_tokens(ids[slot - 1 : slot + 2]) == [":", SLOT_TOKEN, '"']
    expected = reference_states(decoder_path, ids, slot, start, end)

    inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    with torch.no_grad(), backbone.prepending.applied(inputs):
        hidden = backbone.model(**inputs, output_hidden_states=True).hidden_states
    for index, (got, want) in enumerate(zip(hidden, expected)):
        np.testing.assert_allclose(got[0].numpy(), want.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"hidden state {index}")
    for index in range(start, end):  # the slot holds the previous layer's last-token state
        np.testing.assert_allclose(hidden[index][0, slot].numpy(), expected[index][-1].numpy(), rtol=1e-4, atol=1e-5)
    outside = [i for i in range(len(hidden) - 1) if not start <= i < end]
    for index in outside:  # elsewhere the slot is a token like any other
        assert not np.allclose(hidden[index][0, slot].numpy(), hidden[index][0, -1].numpy(), atol=1e-3)
    # the pooled vector is the last token of the last layer, as the reference computes it
    vector = pool(backbone.embed([text]).states, np.ones((1, len(ids)), dtype=bool), "last_token")
    np.testing.assert_allclose(vector[0], expected[-1][-1].numpy(), rtol=1e-4, atol=1e-5)
    # and it differs from the same prompt (with the slot) without prepending
    plain = AutoModel.from_pretrained(decoder_path).eval()
    with torch.no_grad():
        unhooked = plain(inputs_embeds=_embeds_with_mean_slot(plain, ids, slot)[None]).last_hidden_state[0, -1]
    assert not np.allclose(vector[0], unhooked.numpy(), atol=1e-3)


def _embeds_with_mean_slot(model, ids: list[int], slot: int) -> torch.Tensor:
    table = model.get_input_embeddings().weight
    return torch.stack([table.mean(dim=0) if i == slot else table[token] for i, token in enumerate(ids)])


def test_off_is_bit_identical_to_the_plain_model(decoder_path):
    """Without the option the backbone's config and vectors are those of the untouched path."""
    backbone = _backbone(decoder_path, prompt=PROMPT, layers="first_last")
    assert "token_prepending" not in backbone.get_config() and backbone.prepending is None
    assert SLOT_TOKEN not in backbone.tokenizer.get_vocab()
    tokenizer = AutoTokenizer.from_pretrained(decoder_path)
    model = AutoModel.from_pretrained(decoder_path).eval()
    for text in TEXTS:
        ids = tokenizer(PROMPT.replace("{text}", text))["input_ids"]
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        expected = torch.stack([hidden[1].float(), hidden[-1].float()]).mean(dim=0)[0].numpy()
        batch = backbone.embed([text])
        assert batch.input_ids[0].tolist() == ids
        assert np.array_equal(batch.states[0], expected)


def _left_padded(batch_ids: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(ids) for ids in batch_ids)
    input_ids = np.full((len(batch_ids), width), pad_id, dtype=np.int64)
    attention = np.zeros((len(batch_ids), width), dtype=bool)
    for row, ids in enumerate(batch_ids):
        input_ids[row, width - len(ids) :] = ids
        attention[row, width - len(ids) :] = True
    return input_ids, attention


@pytest.mark.parametrize("pooling", ["last_token", "mean"])
def test_batches_with_left_or_right_padding_match_one_text_at_a_time(decoder_path, pooling):
    encoder = ShapedEncoder.create(
        decoder_path, prompt=PROMPT, pooling=pooling, layers="first_last", token_prepending=True, tp_layers="0:2", device="cpu"
    )
    alone = np.stack([encoder.embed_raw([text])[0] for text in TEXTS])
    right = encoder.embed_raw(TEXTS, batch_size=len(TEXTS))  # the backbone pads on the right
    np.testing.assert_allclose(right, alone, rtol=1e-4, atol=1e-5)

    backbone = encoder.backbone
    ids, _special = backbone.tokenize(TEXTS)
    input_ids, attention = _left_padded(ids, backbone.tokenizer.pad_token_id)
    assert not attention[:, 0].all()
    batch = backbone.forward(input_ids, attention, ~attention)
    left = pool(batch.states, attention, pooling, None, batch.target_index)
    assert np.isfinite(left).all()
    np.testing.assert_allclose(left, alone, rtol=1e-4, atol=1e-5)


def test_an_encoder_only_model_is_one_line_error(tiny_bert_path):
    with pytest.raises(ValueError, match="needs a causal \\(decoder\\) language model") as error:
        ShapedEncoder.create(tiny_bert_path, token_prepending=True, device="cpu")
    assert "\n" not in str(error.value)


def test_no_layer_list_and_bad_ranges_are_one_line_errors():
    with pytest.raises(ValueError, match="no list of 4 decoder layers"):
        find_layer_list(torch.nn.Sequential(torch.nn.Linear(2, 2)), 4)
    for spec, message in [
        ("1:9", "0 <= START < END <= 8"),
        ("3:3", "START < END"),
        ("x", "START:END"),
        ((1, 2, 3), "two layer indices"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_tp_layers(spec, 8)
    assert parse_tp_layers(None, 32) == (1, 8) and parse_tp_layers(None, 3) == (1, 2)
    assert parse_tp_layers("2:5", 8) == (2, 5) and parse_tp_layers([0, 8], 8) == (0, 8)


def test_tp_layers_without_token_prepending_or_on_a_static_table(tiny_glove_path, decoder_path):
    with pytest.raises(ValueError, match="applies only with token_prepending"):
        ShapedEncoder.create(decoder_path, tp_layers="1:2", device="cpu")
    with pytest.raises(ValueError, match="not a static table"):
        ShapedEncoder.create(tiny_glove_path, token_prepending=True)


def test_slot_template():
    assert slot_template(PROMPT) == 'This sentence : <PST> "{text}" means in one word:"'
    assert slot_template(None) == "<PST> {text}"
    assert slot_template("Query: {text}") == "Query: <PST> {text}"


def test_slot_is_special_and_survives_truncation_of_the_text(decoder_path):
    backbone = _backbone(decoder_path, prompt=PROMPT, token_prepending=True, max_length=16)
    assert backbone.prepending.slot_id in backbone.special_ids()
    (ids,), (special,) = backbone.tokenize([TEXTS[2]])
    assert len(ids) == 16 and ids.count(backbone.prepending.slot_id) == 1
    assert special[ids.index(backbone.prepending.slot_id)] == 1
    assert backbone.tokenizer.convert_ids_to_tokens(ids[-4:]) == ["one", "word", ":", '"']


def test_fit_save_load_fingerprint_and_composition(decoder_path, tmp_path):
    """TP with layer averaging, idf weights and a fitted chain; saved in isotrope.json and the fingerprint."""
    texts = make_sentences(60, seed=3)
    options = {
        "prompt": PROMPT,
        "pooling": "mean",
        "layers": "first_last",
        "weights": "idf",
        "shape": "center,whiten,l2",
        "device": "cpu",
    }
    encoder = ShapedEncoder.create(decoder_path, token_prepending=True, tp_layers="1:3", **options).fit(texts)
    vectors = encoder.encode(TEXTS)
    folder = encoder.save(tmp_path / "enc")
    saved = json.loads((Path(folder) / "isotrope.json").read_text())
    assert saved["backbone"]["token_prepending"] is True and saved["backbone"]["tp_layers"] == [1, 3]
    loaded = ShapedEncoder.load(folder, device="cpu")
    assert loaded.fingerprint == encoder.fingerprint
    np.testing.assert_allclose(loaded.encode(TEXTS), vectors, rtol=1e-5, atol=1e-6)
    others = [
        ShapedEncoder.create(decoder_path, **options).fit(texts),
        ShapedEncoder.create(decoder_path, token_prepending=True, tp_layers="0:3", **options).fit(texts),
    ]
    assert len({encoder.fingerprint, *(other.fingerprint for other in others)}) == 3


def test_token_state_cache_keys_include_the_tp_settings(decoder_path, tmp_path):
    backbones = [
        _backbone(decoder_path, prompt=PROMPT),
        _backbone(decoder_path, prompt=PROMPT, token_prepending=True, tp_layers=(1, 2)),
        _backbone(decoder_path, prompt=PROMPT, token_prepending=True, tp_layers=(0, 2)),
    ]
    cached = [CachedBackbone(backbone, tmp_path / "cache") for backbone in backbones]
    assert len({c._prefix() for c in cached}) == 3
    for backbone, wrapped in zip(backbones, cached):  # one shared cache folder, each backbone its own states
        _, direct = next(backbone.iter_batches(TEXTS[:2], batch_size=2))
        _, through = next(wrapped.iter_batches(TEXTS[:2], batch_size=2))
        real = direct.attention_mask[:, :, None]  # the cache keeps real tokens only
        np.testing.assert_allclose(through.states * real, direct.states * real, rtol=1e-5, atol=1e-6)
        wrapped.close()


def test_index_and_search_a_store_with_token_prepending(decoder_path, tmp_path):
    from isotrope.ingest.pipeline import index_documents
    from isotrope.search import Collection

    source = tmp_path / "docs"
    source.mkdir()
    sentences = make_sentences(40, seed=5)
    for number, sentence in enumerate(sentences):  # one chunk per file
        (source / f"{number:02d}.txt").write_text(sentence + "\n")
    store = f"faiss:{tmp_path / 'store'}"
    index_documents(
        source,
        store,
        config=EncoderConfig(model=decoder_path, shape="center", pooling="last_token", token_prepending=True, tp_layers="1:3"),
        chunk_tokens=64,
        overlap_tokens=8,
        show_progress=False,
    )
    with Collection.open(store) as collection:
        assert collection.encoder.backbone.get_config()["tp_layers"] == [1, 3]
        hits = collection.search(sentences[7], k=1)  # a stored text finds itself
        assert hits[0].metadata["source"].endswith("07.txt") and hits[0].score > 0.999


def test_eval_sts_cli_end_to_end(decoder_path, tmp_path, monkeypatch, capsys):
    """The documented evaluation command, on a tiny decoder saved to a folder and a tiny pairs file."""
    from isotrope.cli import main

    pairs = tmp_path / "tiny_pairs.tsv"
    rows = [
        ("the cat runs", "the dog runs", 3.5),
        ("a red car", "the blue car", 3.0),
        ("she sleeps", "the river", 0.5),
        ("dogs eat food", "the dog eats", 4.0),
        ("the sun is big", "rain and snow", 1.0),
    ]
    pairs.write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows), encoding="utf-8")
    out = tmp_path / "result.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "isotrope",
            "eval",
            "sts",
            "--model",
            decoder_path,
            "--prompt",
            PROMPT,
            "--pooling",
            "last_token",
            "--token-prepending",
            "--pairs",
            str(pairs),
            "--json",
            str(out),
        ],
    )
    try:
        main()
    except SystemExit as exit_:
        assert exit_.code in (0, None), capsys.readouterr().err
    result = json.loads(out.read_text())
    assert -100 <= result["scores"]["tiny_pairs"] <= 100 and result["average"] == result["scores"]["tiny_pairs"]


def test_eval_cli_on_an_encoder_only_model_prints_one_line(tiny_bert_path, tmp_path, monkeypatch, capsys):
    from isotrope.cli import main

    pairs = tmp_path / "p.tsv"
    pairs.write_text("the cat\tthe dog\t1.0\na car\tthe sun\t2.0\n", encoding="utf-8")
    monkeypatch.setattr(
        sys, "argv", ["isotrope", "eval", "sts", "--model", tiny_bert_path, "--token-prepending", "--pairs", str(pairs)]
    )
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    assert err.strip().count("\n") == 0 and "causal (decoder) language model" in err


def test_shape_auto_and_the_harness_keep_tp_recipes_apart(decoder_path, tmp_path):
    """`--shape auto` chooses over TP token states; TP and plain recipes never share a backbone or cached states."""
    from isotrope.evaluate.commands import evaluate
    from isotrope.evaluate.harness import Evaluator

    corpus = tmp_path / "corpus.txt"
    documents = [" ".join(s.rstrip(".!?").capitalize() + "." for s in make_sentences(4, seed=i)) for i in range(80)]
    corpus.write_text("\n".join(documents) + "\n")  # several sentences each: pseudo-queries are cut from them
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("the cat runs\tthe dog runs\t3.5\na red car\tthe sun\t0.5\ndogs eat food\tthe dog eats\t4.0\n")
    evaluator = Evaluator(cache_dir=tmp_path / "cache")
    base = {"model": decoder_path, "prompt": PROMPT, "pooling": "last_token"}
    tp = EncoderConfig(**base, shape="auto", token_prepending=True, tp_layers="1:3")
    result = evaluate("sts", tp, evaluator, pairs=[pairs], fit_corpus=str(corpus))
    assert "auto chose" in result["fitted_on"] and result["auto_shape"]["candidates"]
    assert "tp=1:3" in tp.label()
    plain = evaluator.build(EncoderConfig(**base))
    with_tp = evaluator.build(EncoderConfig(**base, token_prepending=True, tp_layers="1:3"))
    assert plain.backbone is not with_tp.backbone
    assert with_tp.backbone.get_config()["tp_layers"] == [1, 3] and "tp_layers" not in plain.backbone.get_config()
    assert not np.allclose(plain.embed_raw(TEXTS[:2]), with_tp.embed_raw(TEXTS[:2]), atol=1e-3)


def _run(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    from isotrope.cli import main

    monkeypatch.setattr(sys, "argv", ["isotrope", *map(str, args)])
    try:
        main()
    except SystemExit as exit_:
        return (exit_.code if isinstance(exit_.code, int) else 1), capsys.readouterr().err
    return 0, capsys.readouterr().err


def test_fit_and_index_commands_take_the_tp_options(decoder_path, tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(make_sentences(30, seed=9)) + "\n")
    code, err = _run(
        monkeypatch,
        capsys,
        "fit",
        corpus,
        "--out",
        tmp_path / "enc",
        "--model",
        decoder_path,
        "--prompt",
        PROMPT,
        "--pooling",
        "last_token",
        "--shape",
        "center",
        "--token-prepending",
        "--tp-layers",
        "0:2",
    )
    assert code == 0, err
    loaded = ShapedEncoder.load(tmp_path / "enc", device="cpu")
    assert loaded.backbone.get_config()["tp_layers"] == [0, 2]
    code, err = _run(
        monkeypatch,
        capsys,
        "index",
        corpus,
        "--store",
        f"faiss:{tmp_path / 'store'}",
        "--model",
        decoder_path,
        "--pooling",
        "last_token",
        "--token-prepending",
        "--chunk-tokens",
        "64",
        "--overlap-tokens",
        "8",
    )
    assert code == 0, err
    from isotrope.search import Collection

    with Collection.open(f"faiss:{tmp_path / 'store'}") as collection:
        assert collection.encoder.backbone.get_config()["tp_layers"] == [1, 2]  # the default on 3 layers
    code, err = _run(
        monkeypatch,
        capsys,
        "fit",
        corpus,
        "--out",
        tmp_path / "bad",
        "--model",
        decoder_path,
        "--token-prepending",
        "--tp-layers",
        "2:9",
    )
    assert code == 1 and err.strip() == "error: tp_layers 2:9 must satisfy 0 <= START < END <= 3 (the model's layers)"


def _other_family(name: str):
    from transformers import (
        GPTNeoXConfig,
        GPTNeoXModel,
        MistralConfig,
        MistralModel,
        OPTConfig,
        OPTModel,
        Qwen2Config,
        Qwen2Model,
    )

    size, common = (
        len(DECODER_VOCAB),
        {"num_hidden_layers": 3, "num_attention_heads": 4, "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2},
    )
    if name == "opt":
        return OPTModel(OPTConfig(vocab_size=size, hidden_size=32, ffn_dim=64, word_embed_proj_dim=32, pad_token_id=0, **common))
    if name == "gpt_neox":
        return GPTNeoXModel(GPTNeoXConfig(vocab_size=size, hidden_size=32, intermediate_size=64, **common))
    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2Model), "mistral": (MistralConfig, MistralModel)}[name]
    return model_class(config_class(vocab_size=size, hidden_size=32, intermediate_size=64, num_key_value_heads=2, **common))


@pytest.mark.parametrize("family", ["qwen2", "mistral", "opt", "gpt_neox"])
def test_other_decoder_families(family, tmp_path):
    """The hooks find the layer list of other families; the slot is replaced; padding does not change vectors."""
    torch.manual_seed(0)
    model = _other_family(family).eval()
    _randomise_norms(model)
    model.save_pretrained(tmp_path)
    _tokenizer(bos=True).save_pretrained(tmp_path)
    encoder = ShapedEncoder.create(
        str(tmp_path), prompt=PROMPT, pooling="last_token", token_prepending=True, tp_layers="0:2", device="cpu"
    )
    backbone = encoder.backbone
    (ids,), _ = backbone.tokenize(TEXTS[:1])
    slot = ids.index(backbone.prepending.slot_id)
    inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    with torch.no_grad(), backbone.prepending.applied(inputs):
        hidden = backbone.model(**inputs, output_hidden_states=True).hidden_states
    for index in range(4):
        replaced = torch.equal(hidden[index][0, slot], hidden[index][0, -1])
        assert replaced == (index < 2), index
    alone = np.stack([encoder.embed_raw([text])[0] for text in TEXTS])
    np.testing.assert_allclose(encoder.embed_raw(TEXTS, batch_size=len(TEXTS)), alone, rtol=1e-4, atol=1e-5)
    token_ids, _ = backbone.tokenize(TEXTS)
    input_ids, attention = _left_padded(token_ids, backbone.tokenizer.pad_token_id)
    batch = backbone.forward(input_ids, attention, ~attention)
    np.testing.assert_allclose(pool(batch.states, attention, "last_token"), alone, rtol=1e-4, atol=1e-5)


def test_a_sweep_point_takes_the_tp_keys(decoder_path, tmp_path):
    from isotrope.evaluate.sweep import run_sweep

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("the cat runs\tthe dog runs\t3.5\na red car\tthe sun\t0.5\ndogs eat food\tthe dog eats\t4.0\n")
    base = {"model": decoder_path, "prompt": PROMPT, "pooling": "last_token"}
    config = tmp_path / "sweep.json"
    config.write_text(
        json.dumps(
            {
                "cache_dir": str(tmp_path / "cache"),
                "tasks": {"sts": {"pairs": [str(pairs)]}},
                "recipes": [base, {**base, "token_prepending": True, "tp_layers": "1:3"}],
            }
        )
    )
    rows = run_sweep(config, tmp_path / "out")
    assert [row["recipe"].endswith("shape=none") for row in rows] == [True, True]
    assert "tp=1:3" in rows[1]["recipe"] and "tp" not in rows[0]["recipe"].split()
