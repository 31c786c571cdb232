"""Steering: a chat message that joins the session's running agent loop instead of waiting for its own run.

With busy mode ``steer`` (``/busy steer``), a message arriving while its session's chat run goes on is accepted
into the inbox like any other, then offered to that run's ``SteerBox``. The agent loop takes what is waiting
before each model call and adds it to the conversation as user messages (and to the stored transcript, in order).

Invariant (never lost, answered once): a steered message's inbox row and run stay unfinished until the run that
took it records its completion; ``Store.finish_run`` closes them in that same transaction (``RunCompletion.steered``,
the steered run recorded with ``ended_by`` "steered"). The box lives in memory only: when the process dies before
that commit, the interrupted run is redone from its start without the message, and the message, still pending in
the inbox, is resumed after it as a run of its own. A message the run did not take (it arrived after the run's last
model call, or the run was stopped first) is handed back when the box closes and runs next, as if queued.

The user sees a steered message's status reaction (gateway/reactions.py) turn to working when the run takes it and
end as the run ends. No message of its own: the answer shows the steer, and a note sent as the message is offered
could be wrong (the run may end before taking it).

With several replicas a message steers only a run of this replica; a run going on elsewhere gets it queued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Job = TypeVar("Job")


@dataclass(slots=True, frozen=True)
class Steered:
    """A message taken by a run: its text, and the inbox event and run it was accepted as."""

    text: str
    inbox_id: int
    run_id: str


@dataclass(slots=True)
class SteerBox(Generic[Job]):
    """The messages offered to one running run, each with the job it would otherwise run as: those waiting and
    those the run took. Used on the event loop only, so offering and closing never race."""

    _waiting: list[tuple[Steered, Job]] = field(default_factory=list)
    taken: list[tuple[Steered, Job]] = field(default_factory=list)
    """What the run added to its conversation, oldest first (recorded with the run's completion)."""
    closed: bool = False

    def offer(self, message: Steered, job: Job) -> bool:
        """Hand a message to the run; False once the box is closed (the caller queues it instead)."""
        if self.closed:
            return False
        self._waiting.append((message, job))
        return True

    def take(self) -> list[tuple[Steered, Job]]:
        """The messages waiting now, marked as taken (before each of the run's model calls)."""
        waiting, self._waiting = self._waiting, []
        self.taken += waiting
        return waiting

    def again(self) -> None:
        """The run starts again from its beginning (its worker died): what it took waits again, first."""
        self._waiting, self.taken = self.taken + self._waiting, []

    def close(self) -> list[Job]:
        """No more offers; the jobs of messages the run never took, oldest first (they run next)."""
        self.closed = True
        left, self._waiting = self._waiting, []
        return [job for _, job in left]


TakeSteered = Callable[[], list[str]]
"""What the agent loop calls before each model call: the texts of the steering messages to add."""
