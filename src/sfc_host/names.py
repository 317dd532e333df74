"""What a scope and a job id may be: one rule for Redis keys, MQTT topics, the MES
and the settings, so a name one of them takes every other takes too."""

from __future__ import annotations

import re

from sfc_host.errors import SfcHostError

# A scope names a hash tag (braces would end the tag early) and one MQTT topic level
# (no '/', '+' or '#'), so only these characters are allowed.
_SCOPE_RE = re.compile(r"^[A-Za-z0-9_.\-@]{1,128}$")
MAX_JOB_ID = 256


class InvalidName(SfcHostError, ValueError):
    """A scope or job id that cannot name a key."""


def _shown(v: object) -> str:
    # the message goes to logs and MES replies: a megabyte id is shown by its start
    r = repr(v)
    return r if len(r) <= 80 else r[:80] + "…"


def check_scope(scope: str) -> str:
    if not isinstance(scope, str) or not _SCOPE_RE.match(scope):
        raise InvalidName(f"invalid scope {_shown(scope)}: 1-128 characters of letters, "
                          "digits and '_.-@'")
    return scope


# a control character, a brace (the cluster hash tag) or '#': one compiled scan, not a
# Python step per character (every entry's job id is checked as it is read)
_JOB_BAD = re.compile(r"[\x00-\x1f{}#]")


def check_job(job: str) -> str:
    if (not isinstance(job, str) or not job or len(job) > MAX_JOB_ID
            or _JOB_BAD.search(job) is not None):
        raise InvalidName(f"invalid job id {_shown(job)}: 1-{MAX_JOB_ID} characters, no "
                          "control characters, braces or '#'")
    return job
