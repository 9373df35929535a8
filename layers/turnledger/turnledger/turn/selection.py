"""Provider selection: which provider and model a turn may name, who writes summaries,
and the deployment's redaction rules and embedder as a request sees them.

Mixed into the service (:class:`~turnledger.turn.pipeline.Conversations`): these read its
configuration (``provider`` may be swapped after construction, as tests do).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING

from ..context.policy import DataPolicy
from ..context.redaction import Redactor
from ..context.tokens import TokenizingRedactor
from ..core.exceptions import DataPolicyUnsatisfied, UnknownModel, UnknownProvider
from ..core.models import ConversationKey
from ..core.observability import logger
from ..providers.base import Provider
from ..providers.embeddings import Embedder
from ..store.data_policies import PolicyVersions
from . import policy_gate
from .reads import Reads
from .session import Session

#: Seconds a tenant's own data policy is reused before it is read again (a new version
#: reaches every environment within this).
TENANT_POLICY_MAX_AGE_SECONDS = 60

if TYPE_CHECKING:
    from .execution import TurnWork


class ProviderSelection(Reads):
    """The providers, model and helpers of one deployment's turns."""

    #: The deployment's default provider; others it allows are built by ``_build_provider``.
    provider: Provider
    #: Writes context summaries (``None``: the turn's own provider).
    summarizer: Provider | None
    _build_provider: Callable[[str], Provider] | None
    _providers: dict[str, Provider]
    _embedder: Embedder | Callable[[], Embedder | None] | None
    _redactor: Redactor | Callable[[], Redactor | None] | None
    _data_policy: DataPolicy | Callable[[], DataPolicy | None] | None
    #: Tenants' own policies as last read: (until when, policy).
    _tenant_policies: dict[str, tuple[float, DataPolicy | None]]

    @cached_property
    def embedder(self) -> Embedder | None:
        """What ranks memory records by embeddings (built on first use), or ``None``."""
        if self._embedder is None or isinstance(self._embedder, Embedder):
            return self._embedder
        return self._embedder()

    def provider_for(self, name: str | None) -> Provider:
        """The provider a turn names (``None``: the default one).

        Raises:
            UnknownProvider: the deployment does not enable that provider.
        """
        if name is None or name == self.provider.name:
            return self.provider
        if name not in self.settings.allowed_providers or self._build_provider is None:
            raise UnknownProvider(
                f"provider {name!r} is not enabled in this deployment",
                details={"provider": name, "allowed": list(self.settings.allowed_providers)},
            )
        if name not in self._providers:
            self._providers[name] = self._build_provider(name)
        return self._providers[name]

    def check_model(self, name: str | None) -> None:
        """Refuse a model the deployment does not allow a turn to name (``None``: the default).

        Raises:
            UnknownModel: ``name`` is not in :attr:`Settings.models_allowed`.
        """
        allowed = self.settings.models_allowed
        if name is not None and allowed is not None and name not in allowed:
            raise UnknownModel(
                f"model {name!r} is not allowed in this deployment",
                details={"model": name, "allowed": sorted(allowed)},
            )

    def forget_provider_state(self, responses: list[tuple[str, str]]) -> int:
        """Delete stored provider responses, best effort; returns how many were deleted.

        Never raises: a clear or a sweep is never blocked by a provider.
        """
        deleted = 0
        by_provider: dict[str, list[str]] = {}
        for name, response_id in dict.fromkeys(responses):
            by_provider.setdefault(name, []).append(response_id)
        for name, ids in by_provider.items():
            try:
                deleted += self.provider_for(name).delete_state(ids)
            except Exception as exc:  # a provider no longer enabled, or a bug: never blocks
                logger.warning(
                    "could not delete provider state",
                    extra={"provider": name, "error": type(exc).__name__},
                )
        return deleted

    @property
    def redactor(self) -> Redactor | None:
        """The redaction rule set in force (a source such as SSM is asked each time; it caches)."""
        if self._redactor is None or isinstance(self._redactor, Redactor):
            return self._redactor
        return self._redactor()

    def redactor_for(
        self, key: ConversationKey, data_class: str | None, gen: str
    ) -> Redactor | None:
        """What a model sees of a conversation of ``data_class`` through: the redaction
        rules, after its protected values are made tokens (a conversation with a class,
        under a policy with detectors; ``turnledger.context.tokens``): those of its life
        ``gen``."""
        rules = self.redactor
        policy = self.data_policy(key.tenant)
        if policy is None or data_class is None or not policy.detectors:
            return rules
        return TokenizingRedactor.of(policy, self.token_secret(key, gen, create=True), rules)

    def data_policy(self, tenant: str) -> DataPolicy | None:
        """The data policy ``tenant``'s conversations are held to (``None``: none): the
        tenant's own newest version where tenants may set one (``DATA_POLICY_ADMIN_SCOPE``;
        read at most every :data:`TENANT_POLICY_MAX_AGE_SECONDS` per environment), else
        the deployment's (a source such as SSM is asked each time; it caches)."""
        if self.settings.data_policy_admin_scope:
            own = self.tenant_policy(tenant)
            if own is not None:
                return own
        if self._data_policy is None or isinstance(self._data_policy, DataPolicy):
            return self._data_policy
        return self._data_policy()

    def tenant_policy(self, tenant: str, *, fresh: bool = False) -> DataPolicy | None:
        """``tenant``'s own newest policy version (``None``: none), cached a short while."""
        now = time.monotonic()
        cached = self._tenant_policies.get(tenant)
        if cached is not None and not fresh and cached[0] > now:
            return cached[1]
        stored = PolicyVersions(self.store, tenant).latest()
        policy = DataPolicy.parse(stored.policy, "the tenant's") if stored is not None else None
        self._tenant_policies[tenant] = (now + TENANT_POLICY_MAX_AGE_SECONDS, policy)
        return policy

    def route_side_call(
        self, session: Session, model: str, provider: Provider, purpose: str
    ) -> tuple[str, Provider] | None:
        """The model and provider a summary or a memory extraction of ``session`` may use:
        as asked in a conversation with no class; else as its class routes them (the
        choice staged as a ``policy_decision`` event of ``purpose``), or ``None`` when no
        allowed model may do it (the call is skipped, never sent elsewhere)."""
        policy = self.data_policy(session.key.tenant)
        if policy is None or session.data_class is None:
            return model, provider
        try:
            routing = policy_gate.decide(
                policy,
                session.data_class,
                model=model,
                provider=provider.name,
                settings=self.settings,
            )
        except DataPolicyUnsatisfied:
            logger.warning(
                "no model the data class allows may make this call: skipped",
                extra={"purpose": purpose, "data_class": session.data_class},
            )
            return None
        assert routing.chosen is not None
        if routing.chosen.provider is not None:
            provider = self.provider_for(routing.chosen.provider)
        event = policy_gate.decision_event(policy, routing, provider=provider.name, purpose=purpose)
        session.add(event, actor="system")
        return routing.chosen.model, provider

    def _provider_of(self, name: str | None) -> Provider:
        # A turn continued later uses its own provider, even if the deployment dropped it
        # from the allowed list meanwhile: the turn was accepted with it.
        try:
            return self.provider_for(name)
        except UnknownProvider:
            return self.provider

    def _summarizer(self, work: TurnWork) -> Provider:
        """Who writes summaries: the one given, ``SUMMARIZER_PROVIDER``, or the turn's own."""
        if self.summarizer is not None:
            return self.summarizer
        name = self.settings.summarizer_provider
        if not name or name == work.provider.name or self._build_provider is None:
            return work.provider
        if name not in self._providers:
            # Configured by the deployment itself: no need to be a provider turns may name.
            self._providers[name] = self._build_provider(name)
        return self._providers[name]
