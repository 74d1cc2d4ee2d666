"""LangChain's own E2B backend for deepagents (langchain-e2b), unchanged,
through LangChain's standard sandbox suite (langchain-tests), against
berth: the integration code agent developers use today, with only E2B's
environment variables pointed at berth."""

from __future__ import annotations

from collections.abc import Iterator

import e2b
import pytest
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_e2b import E2BSandbox
from langchain_tests.integration_tests import SandboxIntegrationTests


class TestLangChainE2BOnBerth(SandboxIntegrationTests):
    @pytest.fixture
    def sandbox(self, berth_url: str) -> Iterator[SandboxBackendProtocol]:
        s = e2b.Sandbox.create(timeout=600)
        try:
            yield E2BSandbox(sandbox=s)
        finally:
            s.kill()

    @pytest.fixture
    def sandbox_backend(self, sandbox: SandboxBackendProtocol) -> SandboxBackendProtocol:
        return sandbox
