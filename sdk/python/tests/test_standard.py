"""LangChain's standard conformance suite for sandbox backends, against a
real berth daemon, with a fresh sandbox for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_tests.integration_tests import SandboxIntegrationTests

from berth import Berth
from berth.deepagents import BerthSandbox


# Tests of langchain-tests 1.1.9 that contradict deepagents 0.7.32's own
# contract, which BerthSandbox follows (and BaseSandbox fails them alike).
_GLOB_ABSOLUTE = (
    "langchain-tests 1.1.9 expects glob paths relative to the search root; deepagents 0.7.32's "
    "BackendProtocol.glob says FileInfo.path is always absolute (permission rules match absolute paths)"
)
_GLOB_FILES_ONLY = (
    "langchain-tests 1.1.9 expects glob to match directories; deepagents 0.7.32's BackendProtocol.glob "
    "says only regular files are returned"
)
_WRITE_OVERWRITES = (
    "langchain-tests 1.1.9 expects write() to refuse an existing file; deepagents 0.7.32's "
    "BaseSandbox.write creates or overwrites"
)
KNOWN_INCOMPATIBLE = {
    "test_glob": _GLOB_ABSOLUTE,
    "test_glob_basic_pattern": _GLOB_ABSOLUTE,
    "test_glob_hidden_files_explicitly": _GLOB_ABSOLUTE,
    "test_glob_with_character_class": _GLOB_ABSOLUTE,
    "test_glob_with_question_mark": _GLOB_ABSOLUTE,
    "test_glob_with_directories": _GLOB_FILES_ONLY,
    "test_write_existing_file_fails": _WRITE_OVERWRITES,
}


class TestBerthSandboxStandard(SandboxIntegrationTests):
    @pytest.fixture
    def sandbox(self, sync_client: Berth) -> Iterator[SandboxBackendProtocol]:
        sb = sync_client.create()
        try:
            yield BerthSandbox(sandbox=sb)
        finally:
            sb.delete()

    @pytest.fixture
    def sandbox_backend(self, sandbox: SandboxBackendProtocol) -> SandboxBackendProtocol:
        return sandbox


for _name, _reason in KNOWN_INCOMPATIBLE.items():
    _base = getattr(SandboxIntegrationTests, _name)
    setattr(TestBerthSandboxStandard, _name, pytest.mark.xfail(reason=_reason, strict=True)(_base))
