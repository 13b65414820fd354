"""The ``isotrope`` command line."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(
    name="isotrope",
    help="Shaped sentence encoders, and FAISS/LanceDB stores that keep them beside the vectors.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_state = {"debug": False}

Model = Annotated[str, typer.Option("--model", "-m", help="HF name/path, static:<model>, random:<model>, glove-6b-50d or a vectors file")]
Shape = Annotated[str, typer.Option("--shape", "-s", help="preset (none, center, abtt, whiten, whiten-partial, quantile, flow) or a chain like 'center,abtt(3),l2'")]
Pooling = Annotated[str, typer.Option(help="cls, mean, max, mean_sqrt_len, weighted_mean, last_token, mask")]
Layers = Annotated[str, typer.Option(help="last, first_last, an index or a comma list (HF indexing: 0 = embeddings)")]
Prompt = Annotated[Optional[str], typer.Option(help="template with {text}; its [MASK] (or last token) is pooled with --pooling mask")]
Weights = Annotated[str, typer.Option(help="uniform, idf, sif, usif")]
Frequencies = Annotated[str, typer.Option(help="corpus, wordfreq or a 'word count' file")]
TextField = Annotated[str, typer.Option(help="field holding the text in .jsonl files")]


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log progress details")] = False,
) -> None:
    _state["debug"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


def encoder_options(
    model: str,
    shape: str,
    pooling: str,
    layers: str,
    prompt: str | None,
    weights: str,
    frequencies: str,
    drop_top: int,
    exclude_special: bool | None,
    exclude_punctuation: bool,
    max_length: int | None,
) -> dict:
    """Keyword arguments of ShapedEncoder.create from the shared CLI options."""
    return {
        "model": model, "shape": shape, "pooling": pooling, "layers": layers, "prompt": prompt,
        "weights": weights, "frequencies": frequencies, "drop_top": drop_top,
        "exclude_special": exclude_special, "exclude_punctuation": exclude_punctuation, "max_length": max_length,
    }


@app.command()
def fit(
    corpus: Annotated[Path, typer.Argument(help="text file (one text a line) or .jsonl with a text field; .gz allowed")],
    out: Annotated[Path, typer.Option("--out", "-o", help="folder to write the fitted encoder to")],
    model: Model = "all-MiniLM-L6-v2",
    shape: Shape = "none",
    pooling: Pooling = "mean",
    layers: Layers = "last",
    prompt: Prompt = None,
    weights: Weights = "uniform",
    frequencies: Frequencies = "corpus",
    drop_top: Annotated[int, typer.Option(help="drop the N most frequent tokens")] = 0,
    exclude_special: Annotated[Optional[bool], typer.Option("--exclude-special/--include-special")] = None,
    exclude_punctuation: Annotated[bool, typer.Option("--exclude-punctuation")] = False,
    max_length: Annotated[Optional[int], typer.Option(help="max tokens per text")] = None,
    max_samples: Annotated[int, typer.Option(help="fit on a uniform sample of at most this many texts")] = 100_000,
    text_field: TextField = "text",
) -> None:
    """Fit a shaped encoder on a corpus and save it."""
    from isotrope.corpus import iter_texts
    from isotrope.encoder import ShapedEncoder

    encoder = ShapedEncoder.create(**encoder_options(model, shape, pooling, layers, prompt, weights, frequencies,
                                                     drop_top, exclude_special, exclude_punctuation, max_length))
    encoder.fit(iter_texts(corpus, text_field), max_samples=max_samples, fitted_on=str(corpus), show_progress=True)
    encoder.save(out)
    typer.echo(f"saved {encoder!r} to {out}\nfingerprint {encoder.fingerprint}")


@app.command()
def encode(
    encoder_dir: Annotated[Path, typer.Argument(help="a fitted encoder folder (from `isotrope fit`)")],
    input: Annotated[Path, typer.Argument(help="text file (one text a line) or .jsonl")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output .npy file")],
    kind: Annotated[str, typer.Option(help="document or query")] = "document",
    batch_size: Annotated[int, typer.Option()] = 32,
    text_field: TextField = "text",
) -> None:
    """Encode texts with a saved encoder into a float32 .npy matrix."""
    import numpy as np

    from isotrope.corpus import iter_texts
    from isotrope.encoder import ShapedEncoder

    encoder = ShapedEncoder.load(encoder_dir)
    vectors = encoder.encode(list(iter_texts(input, text_field)), kind=kind, batch_size=batch_size, show_progress=True)
    np.save(out, vectors)
    typer.echo(f"wrote {vectors.shape[0]} x {vectors.shape[1]} vectors to {out}")


def main() -> None:
    """Entry point: one clear error line, tracebacks only with --debug."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        app(standalone_mode=False)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as error:  # the CLI's last line of defence: one line, not a traceback
        import click

        if isinstance(error, click.exceptions.Exit):
            sys.exit(error.exit_code)
        if isinstance(error, click.ClickException):
            error.show()
            sys.exit(error.exit_code)
        if _state["debug"]:
            raise
        typer.echo(f"error: {error}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
