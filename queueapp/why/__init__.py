"""'Why did my job wait?': the wait split into parts that add up to it.

The wait runs from submission to start (or to now while queued). Every
instant of the wait is one of:
- a job that was already running when this one arrived (jobs are never
  interrupted);
- a job dispatched ahead of this one, with the term that put it ahead (a
  model swap at its start is split out as its own part);
- llama-swap or the dispatcher away: a dispatch that llama-swap refused (or
  whose dispatcher died) until the next dispatch;
- a drain: jobs of a model with parallel slots still in flight while the GPU
  waits for them all to end before it swaps to another model (a GPU changes
  model only when nothing runs on it, and admits no new job of the resident
  model while one of another model comes first);
- the member's own jobs running elsewhere: the GPU stood idle while the
  member held as many GPUs as their tier allows;
- the GPU idle: between two jobs, dispatch paused, or nothing dispatched.

Jobs of a batchable model share the GPU, so their runs overlap: the wait is
cut at every start and end on the GPU and each piece is counted once, shared
equally by the jobs running through it (or given whole to the drain it is
part of). One job at a time, each piece has one job, and a job's part is its
whole run inside the wait.

A job can be dispatched more than once; each attempt's span runs from its
decision to the event that ended it, so none is counted twice.

With several GPUs the wait is told on one GPU's timeline, so the parts
still add up to it: the GPU the job ran on, or, while it waits, the one the
forecast expects it on (else the first that runs its model). The answer's
`gpus` say what every other GPU was doing: not serving the model, disabled,
down, or busy with other jobs (how many, and how long).

The modules are its layout, lowest first: `spans` (time arithmetic),
`attempts` (each dispatch's span), `kinds`, `shared_time` (holds and
drains), `parts`, `running_limit`, `summary`, `other_gpus`, and `answer`
(`job_why`, which puts them together). Callers import from the package.
"""

from queueapp.why.answer import job_why
from queueapp.why.attempts import ATTEMPT_ENDS, UNDONE
from queueapp.why.kinds import TERM_WORDS, PartKind
from queueapp.why.spans import Span
from queueapp.why.summary import duration_words

__all__ = [
    "ATTEMPT_ENDS",
    "TERM_WORDS",
    "UNDONE",
    "PartKind",
    "Span",
    "duration_words",
    "job_why",
]
