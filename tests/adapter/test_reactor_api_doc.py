"""specs/reactor-api.md documents the whole public API a reactor author sees.

Every name ``mconn`` exports appears in the document in backticks, and so does every
public method of ``Reactor`` and ``Peer``: a name added to the API without a word in the
reference fails here, naming it. (Here, not in tests/core: ``mconn.Peer`` imports Twisted.)
"""

import inspect
import pathlib
import re

import pytest

import mconn

DOC = pathlib.Path(__file__).resolve().parents[2] / "specs" / "reactor-api.md"


def _code_spans() -> list[str]:
    """The inline code spans (`...`) of the document; fenced blocks (the error tree,
    examples) do not count."""
    text = re.sub(r"^```.*?^```", "", DOC.read_text(), flags=re.M | re.S)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]


def _code_words() -> set[str]:
    """Every identifier inside an inline code span."""
    return {word for span in _code_spans() for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


def _signatures() -> set[str]:
    """Names documented as a call or member: a span that is ``name``, ``name(...)`` or
    ``name -> ...``, optionally after ``peer.`` or another prefix."""
    names = set()
    for span in _code_spans():
        match = re.fullmatch(r"(?:\w+\.)?([A-Za-z_]\w*)\s*(?:\(.*|->.*)?", span)
        if match:
            names.add(match.group(1))
    return names


def _public_methods(cls) -> list[str]:
    """Methods and properties a user may call, defined on ``cls`` or a base of it in mconn."""
    names = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("mconn"):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                names.add(name)
    return sorted(names)


def _exported() -> list[str]:
    """``mconn.__all__``, plus names the API promises once mconn exports them."""
    promised = {name for name in ("AckError", "PeerState") if hasattr(mconn, name)}
    return sorted(set(mconn.__all__) | promised)


def test_every_exported_name_is_in_the_reference():
    """Each name in mconn.__all__ (errors included) is written in backticks in the doc."""
    words = _code_words()
    missing = [name for name in _exported() if name not in words]
    assert not missing, f"{DOC.name} does not mention these exports of mconn in backticks: {', '.join(missing)}"


@pytest.mark.parametrize("class_name", ["Reactor", "Peer"])
def test_every_public_method_is_in_the_reference(class_name):
    """Each public method or property of Reactor and Peer is documented in backticks as a
    call or member (`name(...)`, `name -> ...`, `peer.name`)."""
    cls = getattr(mconn, class_name)
    methods = _public_methods(cls)
    assert methods, f"found no public methods on {class_name}"
    documented = _signatures()
    missing = [name for name in methods if name not in documented]
    assert not missing, f"{DOC.name} does not document these public members of {class_name}: {', '.join(missing)}"


def test_every_peer_state_is_in_the_reference():
    """Each PeerState member is in the states table, with the string it compares equal to."""
    if not hasattr(mconn, "PeerState"):
        pytest.skip("mconn does not export PeerState")
    text = DOC.read_text()
    missing = [
        f"{member.name}={member.value!r}"
        for member in mconn.PeerState
        if f"`PeerState.{member.name}`" not in text or f'`"{member.value}"`' not in text
    ]
    assert not missing, f"{DOC.name} does not list these PeerState members with their values: {', '.join(missing)}"
