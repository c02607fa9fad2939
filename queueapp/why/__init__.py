"""'Why did my job wait?': the wait split into parts that add up to it.

The wait runs from submission to start (or to now while queued, or to its
cancel or expiry). It is cut once, on one GPU's timeline, at every recorded
event there (a start, an end, a decision, an idle record), and every piece
of it is one of:
- the job's own earlier attempt: it ran (on this GPU or another), then
  went back to the queue (cut by an unload, refused, its dispatcher gone);
- a job that was already running when this one arrived (jobs are never
  interrupted);
- a job dispatched ahead of this one, with the term that put it ahead (a
  model swap at its start is split out as its own figure);
- llama-swap or the dispatcher away: a dispatch that llama-swap refused (or
  whose dispatcher died) until the next dispatch;
- a drain: jobs of a model with parallel slots still in flight while the GPU
  waits for them all to end before it swaps to another model;
- the member's own jobs running elsewhere: the GPU stood idle while another
  of the member's jobs held their tier's running limit (never the job
  itself);
- the GPU idle: between two jobs, dispatch paused, or nothing dispatched.
  gpusched keeps no history of loads and unloads, nor of requests that did
  not come through it: their time falls here.

Jobs of a batchable model share the GPU, so their runs overlap: a piece
several jobs ran through is shared equally by them and still counted once.
`cut` checks that the pieces tile the wait and sums each part's seconds
from them, so the parts add up by construction (a cut that does not is
logged and flagged, `adds_up`), then rounds the figures so that the shown
ones add up too.

With several GPUs the wait is told on one GPU's timeline: the GPU the job
ran on, or, while it waits, the one the forecast expects it on (else the
first that runs its model). The answer's `other_gpus` say what every other
GPU was doing (not serving the model, disabled, down, or busy with other
jobs: how many, and how long); that is never added into the parts.

The modules are its layout, lowest first: `spans` (time arithmetic),
`attempts` (each dispatch's span), `kinds`, `shared_time` (holds, drains
and the pieces), `parts`, `running_limit`, `cut` (the pieces checked and
summed), `summary`, `other_gpus`, and `answer` (`job_why`, which puts them
together). Callers import from the package. docs/concepts/wait-cut.md tells
it for users.
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
