"""Text embeddings for ranking long-term memory records (``MEMORY_EMBEDDINGS``).

Two kinds: ``openai`` posts to an OpenAI-style ``/embeddings`` endpoint over httpx
(``OPENAI_BASE_URL`` and its key, default model ``text-embedding-3-small``), and
``bedrock`` invokes an Amazon Titan text embeddings model through ``bedrock-runtime``
(``BEDROCK_REGION``/``BEDROCK_ENDPOINT``, default ``amazon.titan-embed-text-v2:0``; one
text a call, as Titan takes). Either raises :class:`~turnledger.core.exceptions.ProviderError`
on any failure: memory falls back to keyword ranking, a turn never fails for it.

Vectors are kept on the records as base64 of little-endian float32
(:func:`encode_vector`, :func:`decode_vector`): 1,536 dimensions are 8 KiB of text.
"""

from __future__ import annotations

import base64
import json
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..core.config import Settings
from ..core.exceptions import ProviderError
from .base import ApiKeyProvider

if TYPE_CHECKING:
    import httpx
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient

#: The model of each kind when ``MEMORY_EMBEDDING_MODEL`` is unset.
DEFAULT_MODELS = {"openai": "text-embedding-3-small", "bedrock": "amazon.titan-embed-text-v2:0"}


def encode_vector(vector: Sequence[float]) -> str:
    """``vector`` as base64 of little-endian float32."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def decode_vector(text: str) -> list[float]:
    """Invert :func:`encode_vector`.

    Raises:
        ValueError: ``text`` is not base64 of whole float32 values.
    """
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 4:
        raise ValueError("not a float32 vector")
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


class Embedder(ABC):
    """Turns texts into vectors (one a text, in order)."""

    name: str
    model: str

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """The vectors of ``texts``.

        Raises:
            ProviderError: the service failed or answered something else.
        """


class OpenAIEmbedder(Embedder):
    """``POST {base_url}/embeddings`` of an OpenAI-compatible server."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: ApiKeyProvider | None = None,
        client: httpx.Client | None = None,
        timeout_seconds: float = 10.0,
    ) -> None:
        """Nothing is sent until :meth:`embed`; ``client``: tests pass a mock transport's."""
        # Here: only a deployment with MEMORY_EMBEDDINGS=openai loads httpx for it.
        import httpx

        self.base_url = base_url.rstrip("/")
        self.model = model
        self._api_key = api_key
        self._client = client or httpx.Client()
        self._timeout = httpx.Timeout(timeout_seconds)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One request for every text (see :meth:`Embedder.embed`)."""
        headers = {"Accept": "application/json"}
        try:
            key = self._api_key() if self._api_key is not None else None
            if key:
                headers["Authorization"] = f"Bearer {key.strip()}"
            response = self._client.post(
                f"{self.base_url}/embeddings",
                json={"model": self.model, "input": list(texts)},
                headers=headers,
                timeout=self._timeout,
            )
        except Exception as exc:  # a key source or transport failure alike
            raise ProviderError(
                "the embeddings endpoint could not be reached",
                details={"reason": "embeddings_unavailable", "error": type(exc).__name__},
            ) from exc
        if response.status_code != 200:
            raise ProviderError(
                "the embeddings endpoint refused the request",
                details={"reason": "embeddings_failed", "status": response.status_code},
            )
        try:
            data = sorted(response.json()["data"], key=lambda d: int(d["index"]))
            vectors = [[float(x) for x in item["embedding"]] for item in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise ProviderError(
                "the embeddings endpoint answered something else",
                details={"reason": "embeddings_invalid", "error": type(exc).__name__},
            ) from exc
        if len(vectors) != len(texts):
            raise ProviderError(
                "the embeddings endpoint answered another number of vectors",
                details={"reason": "embeddings_invalid", "expected": len(texts)},
            )
        return vectors


class BedrockEmbedder(Embedder):
    """Amazon Titan text embeddings through ``bedrock-runtime`` ``InvokeModel``."""

    name = "bedrock"

    def __init__(
        self,
        *,
        model: str,
        region: str | None = None,
        endpoint_url: str | None = None,
        client_factory: Callable[[], BedrockRuntimeClient] | None = None,
    ) -> None:
        """The client is built on the first call (``client_factory``: tests)."""
        self.model = model
        self.region = region
        self.endpoint_url = endpoint_url
        self._factory = client_factory or self._aws_client
        self._client: BedrockRuntimeClient | None = None

    def _aws_client(self) -> BedrockRuntimeClient:
        from ..core.aws import AwsSession

        client: BedrockRuntimeClient = AwsSession().client(
            "bedrock-runtime", region_name=self.region, endpoint_url=self.endpoint_url
        )
        return client

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One ``InvokeModel`` a text (see :meth:`Embedder.embed`)."""
        vectors: list[list[float]] = []
        try:
            if self._client is None:
                self._client = self._factory()
            for text in texts:
                answer = self._client.invoke_model(
                    modelId=self.model,
                    contentType="application/json",
                    accept="application/json",
                    body=json.dumps({"inputText": text}),
                )
                payload: Any = json.loads(answer["body"].read())
                vectors.append([float(x) for x in payload["embedding"]])
        except Exception as exc:  # botocore's errors, throttling, an odd body alike
            raise ProviderError(
                "the Bedrock embeddings model failed",
                details={"reason": "embeddings_failed", "error": type(exc).__name__},
            ) from exc
        return vectors


def build_embedder(
    settings: Settings, api_key: ApiKeyProvider | None = None, client: httpx.Client | None = None
) -> Embedder | None:
    """The embedder ``MEMORY_EMBEDDINGS`` names, or ``None`` (keyword ranking)."""
    kind = settings.memory_embeddings
    if kind is None:
        return None
    model = settings.memory_embedding_model or DEFAULT_MODELS[kind]
    if kind == "openai":
        return OpenAIEmbedder(
            base_url=settings.openai_base_url,
            model=model,
            api_key=api_key,
            client=client,
            timeout_seconds=min(settings.provider_timeout_seconds, 10),
        )
    return BedrockEmbedder(
        model=model, region=settings.bedrock_region, endpoint_url=settings.bedrock_endpoint
    )
