"""Line mutations of a valid input file, shared by the parser fuzz tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def mutate_lines(draw: Any, lines: list[str], token: Any, sep: str = " ") -> str:
    """1-4 mutations of ``lines`` (a line deleted, replaced, duplicated, one word replaced by a
    draw of ``token``, or the file cut inside a line), joined back into text."""
    lines = list(lines)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "replace", "token", "duplicate", "truncate"]))
        if op == "delete" and len(lines) > 1:
            del lines[i]
        elif op == "replace":
            lines[i] = draw(st.text(max_size=60))
        elif op == "token":
            words = lines[i].split() or [""]
            j = draw(st.integers(0, len(words) - 1))
            words[j] = draw(token)
            lines[i] = sep.join(words)
        elif op == "duplicate":
            lines.insert(i, lines[i])
        else:
            lines = lines[: i + 1]
            lines[-1] = lines[-1][: draw(st.integers(0, len(lines[-1])))]
    return "\n".join(lines) + draw(st.sampled_from(["\n", ""]))
