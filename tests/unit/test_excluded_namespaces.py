"""The namespaces a Lumigo never takes effect in (issue 28, item 9): the controller skips
`kube-system` and the operator's own namespace, as the injector webhook's namespaceSelector does."""

from __future__ import annotations

import pytest

from controller.lumigo.status import REASON_EXCLUDED_NAMESPACE, excluded_namespace_problem

OPERATOR = "lumigo-system"


@pytest.mark.parametrize(
    ("namespace", "operator_namespace", "why"),
    [
        ("kube-system", OPERATOR, "Kubernetes' own namespace"),
        ("kube-system", "", "Kubernetes' own namespace"),
        (OPERATOR, OPERATOR, "the Lumigo operator's own namespace"),
        ("my-operator", "my-operator", "the Lumigo operator's own namespace"),
        ("default", OPERATOR, None),
        ("shop", OPERATOR, None),
        ("kube-public", OPERATOR, None),
        ("kube-system2", OPERATOR, None),
        ("lumigo-system-2", OPERATOR, None),
        ("", "", None),  # no operator namespace known: only kube-system is excluded
    ],
)
def test_excluded_namespaces(namespace: str, operator_namespace: str, why: str | None) -> None:
    problem = excluded_namespace_problem(namespace, operator_namespace)
    if why is None:
        assert problem is None
        return
    assert problem is not None
    assert f"'{namespace}'" in problem
    assert why in problem
    assert "no workload is instrumented" in problem
    assert REASON_EXCLUDED_NAMESPACE == "ExcludedNamespace"
