"""Progress bars: tqdm where one is shown, imported only then (a one-line query imports no tqdm)."""

from __future__ import annotations

from typing import Any


class _NoProgress:
    """What ``encoding_progress`` gives when no bar is shown (tqdm is not even imported)."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        pass

    def update(self, n: int) -> None:
        pass


def encoding_progress(total: int, show: bool) -> Any:
    """A tqdm bar over ``total`` texts, or a no-op when ``show`` is False (a one-line query imports no tqdm)."""
    if not show:
        return _NoProgress()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="encoding", unit="text")
