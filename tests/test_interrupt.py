"""The SIGINT handler's deferral: a Ctrl-C inside ``interrupt.deferred()`` (a checkpoint being
written) takes effect when the block ends, not inside it."""

from __future__ import annotations

import os
import signal

import pytest

from slipstream_rec import interrupt


@pytest.fixture
def handler():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    installed = interrupt.install()
    yield
    interrupt.restore(installed)
    signal.signal(signal.SIGINT, previous)


def test_a_sigint_inside_the_block_is_raised_when_it_ends(handler):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the block ran to its end")
    assert done and interrupt.received()


def test_a_sigint_outside_the_block_is_raised_at_once(handler):
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10**6):  # the handler runs between bytecodes
            pass
    with interrupt.deferred():
        pass  # nothing held: nothing raised


def test_a_failing_block_keeps_its_own_error(handler):
    with pytest.raises(ValueError):
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            raise ValueError("the write failed")
