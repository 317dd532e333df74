"""asyncio helpers the host's packages share: ``reap`` and ``cancel_and_reap`` wait for
a task the host cancelled without swallowing a cancel of the waiter."""

from sfc_host.aio.cancel import cancel_and_reap, reap

__all__ = ["cancel_and_reap", "reap"]
