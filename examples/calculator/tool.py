"""The calculator tool: find a `<calc>A op B</calc>` call in the model's text and answer `<result>N</result>`.

No eval(): only `int op int` with op in + - * is understood; anything else gets an empty `<result></result>`.
"""

from __future__ import annotations

import re

CALL = re.compile(r"<calc>(.*?)</calc>")
EXPR = re.compile(r"^\s*(-?\d{1,6})\s*([+\-*])\s*(-?\d{1,6})\s*$")


def find_call(text: str) -> str | None:
    """The expression of the last tool call in text, or None."""
    calls = CALL.findall(text)
    return calls[-1] if calls else None


def calculate(expression: str) -> str:
    """'12*7' -> '84'; '' when the expression is not `int op int`."""
    m = EXPR.match(expression)
    if m is None:
        return ""
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(a * b if op == "*" else a + b if op == "+" else a - b)


def tool_message(expression: str) -> dict[str, str]:
    return {"role": "tool", "content": f"<result>{calculate(expression)}</result>"}
