"""MQTT topic names and filters: matching, and the checks a broker would make."""

from __future__ import annotations

MAX_TOPIC_BYTES = 0xFFFF


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic filter matching (``+`` one level, ``#`` the rest; a wildcard first
    level does not match ``$`` topics)."""
    f = topic_filter.split("/")
    t = topic.split("/")
    if topic.startswith("$") and f[0] in ("+", "#"):
        return False
    for i, part in enumerate(f):
        if part == "#":
            return True
        if i >= len(t) or (part != "+" and part != t[i]):
            return False
    return len(f) == len(t)


def filter_problem(topic_filter: object) -> str | None:
    """Why ``topic_filter`` is no MQTT topic filter (MQTT 5 4.7, 4.8.2), or None: empty,
    not a str, U+0000, over 65,535 bytes of UTF-8, a lone surrogate, ``#`` not alone
    as the last level, ``+`` not alone in its level, a ``$share/{group}/…`` with a bad
    group or no filter after it."""
    if not isinstance(topic_filter, str):
        return f"a topic filter is a str, not {type(topic_filter).__name__}"
    if not topic_filter:
        return "a topic filter is never empty"
    if "\0" in topic_filter:
        return "a topic filter has no U+0000 character"
    try:
        size = len(topic_filter.encode())
    except UnicodeEncodeError:
        return "a topic filter is valid UTF-8 (no lone surrogates)"
    if size > MAX_TOPIC_BYTES:
        return f"a topic filter is at most 65,535 bytes, not {size:,}"
    levels = topic_filter.split("/")
    if levels[0] == "$share":
        if len(levels) < 3 or not levels[1] or any(c in levels[1] for c in "+#"):
            return "a shared subscription is $share/{group}/{filter}, the group without + or #"
        levels = levels[2:]
        if not "/".join(levels):
            return "a shared subscription needs a filter after its group"
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "# stands alone as the last level of a topic filter"
        if "+" in level and level != "+":
            return "+ stands alone in its level of a topic filter"
    return None


def dotted_original(topic: str, filters: list[str], most: int = 4) -> str | None:
    """The topic as it was probably sent, if a broker that turns a ``.`` inside a level
    into a level break made it: adjacent levels joined by ``.`` (up to ``most`` of them)
    so that one of ``filters`` matches; None when no such join matches."""
    levels = topic.split("/")
    for i in range(len(levels) - 1):
        for j in range(i + 2, min(len(levels), i + most) + 1):
            joined = "/".join([*levels[:i], ".".join(levels[i:j]), *levels[j:]])
            if any(topic_matches(f, joined) for f in filters):
                return joined
    return None
