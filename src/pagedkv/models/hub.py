"""Model configs from the Hugging Face Hub: config.json and the small index file, never weights.

Downloads go through huggingface_hub and its cache. ``HF_TOKEN``, ``HF_HUB_OFFLINE``,
``HF_ENDPOINT``, ``HF_HUB_CACHE`` and ``HF_HOME`` are read when a config is fetched (not
when huggingface_hub was imported), so a process can change them between calls.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pagedkv.errors import ModelConfigError

__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "DEFAULT_ENDPOINT",
    "PROBE_TIMEOUT_S",
    "CheckpointInfo",
    "is_hub_id",
    "quiet",
    "fetch_config",
    "fetch_checkpoint_info",
    "read_checkpoint_info",
]

# ``org/name``: what the Hub calls a repo id (names without an organisation are not
# looked up, so a mistyped bundled name never turns into a network request).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
_TRUE = {"1", "true", "yes", "on"}
DEFAULT_ENDPOINT = "https://huggingface.co"
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CheckpointInfo:
    """What the safetensors index says about the weights (None where it is silent)."""

    num_params: int | None
    total_bytes: int | None


def is_hub_id(text: str) -> bool:
    return bool(_HUB_ID.match(text.strip()))


@contextlib.contextmanager
def quiet(library: str) -> Iterator[None]:
    """Silence a library's log records below ERROR and its warnings (pagedkv reports one
    line of its own instead)."""
    logger = logging.getLogger(library)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _settings(revision: str | None) -> dict[str, Any]:
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or (
        str(Path(env["HF_HOME"]) / "hub") if env.get("HF_HOME") else None
    )
    return {
        "revision": revision,
        "cache_dir": cache,
        "local_files_only": env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE,
        "token": env.get("HF_TOKEN") or None,
        "endpoint": env.get("HF_ENDPOINT") or None,
    }


def _explain(repo_id: str, revision: str | None, exc: Exception, offline: bool) -> str:
    from huggingface_hub import errors

    at = f" at revision {revision!r}" if revision else ""
    if isinstance(exc, errors.GatedRepoError):
        return (
            f"{repo_id} is gated on the Hugging Face Hub: accept its licence on the model "
            "page, then log in (`hf auth login`) or set HF_TOKEN"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (
            f"{repo_id} is not on the Hugging Face Hub (or is private: log in or set "
            "HF_TOKEN); check the id, or pass a local directory holding its config.json"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{repo_id} has no revision {revision!r} on the Hugging Face Hub"
    if isinstance(exc, errors.LocalEntryNotFoundError):
        if offline:
            return (
                f"HF_HUB_OFFLINE is set and {repo_id}{at} is not in the Hugging Face cache; "
                "unset it to download config.json, or pass a local directory"
            )
        return (
            f"cannot reach the Hugging Face Hub for {repo_id}{at} and it is not cached; "
            "check the network (or HF_ENDPOINT), pass a local directory, or set "
            "HF_HUB_OFFLINE=1 with a cached copy"
        )
    if isinstance(exc, errors.EntryNotFoundError):
        return f"{repo_id}{at} has no {CONFIG_FILE} on the Hugging Face Hub"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"cannot fetch {CONFIG_FILE} of {repo_id}{at}: {type(exc).__name__}: {first}"


def _reachable(endpoint: str | None) -> bool:
    """Whether the Hub's host answers a TCP connection (True behind a proxy: not ours to
    test). Without it huggingface_hub retries an unreachable host for ~25 s."""
    if any(os.environ.get(name) for name in _PROXY_VARS):
        return True
    url = urlsplit(endpoint or DEFAULT_ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def _cached(repo_id: str, filename: str, settings: dict[str, Any]) -> bool:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(
        repo_id, filename, cache_dir=settings["cache_dir"], revision=settings["revision"]
    )
    return isinstance(found, str)


def _download(repo_id: str, filename: str, settings: dict[str, Any]) -> Path:
    from huggingface_hub import errors, hf_hub_download

    online = not settings["local_files_only"]
    if online and not _cached(repo_id, filename, settings) and not _reachable(settings["endpoint"]):
        raise errors.LocalEntryNotFoundError(f"cannot connect to the Hub for {repo_id}")
    with quiet("huggingface_hub"):
        return Path(hf_hub_download(repo_id=repo_id, filename=filename, **settings))


def fetch_config(repo_id: str, revision: str | None = None) -> Path:
    """The cached path of ``repo_id``'s config.json, downloaded if needed."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise ModelConfigError(
            f"{repo_id}: loading a model from the Hugging Face Hub needs huggingface_hub "
            "(pip install 'pagedkv[hub]'), or pass a local directory"
        ) from None
    settings = _settings(revision)
    try:
        return _download(repo_id, CONFIG_FILE, settings)
    except Exception as exc:
        message = _explain(repo_id, revision, exc, settings["local_files_only"])
        raise ModelConfigError(message) from None


def fetch_checkpoint_info(repo_id: str, revision: str | None = None) -> CheckpointInfo | None:
    """The safetensors index's totals, or None (no index, not cached, or unreadable)."""
    try:
        path = _download(repo_id, INDEX_FILE, _settings(revision))
    except Exception:  # the index is optional: absent, not cached, or the Hub said no
        return None
    return read_checkpoint_info(path)


def read_checkpoint_info(path: Path) -> CheckpointInfo | None:
    try:
        metadata = json.loads(path.read_text(encoding="utf-8")).get("metadata") or {}
    except (OSError, ValueError, AttributeError):
        return None
    params = _positive_int(metadata.get("total_parameters"))
    size = _positive_int(metadata.get("total_size"))
    return CheckpointInfo(params, size) if params or size else None


def _positive_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | str) and str(value).isdigit() and int(value) > 0:
        return int(value)
    return None
