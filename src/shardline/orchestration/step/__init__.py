"""One owner for a step's life, from its plan to its end: :mod:`.plan`, :mod:`.jobs` (submit, stop, resubmit, resume),
:mod:`.end` (what the watch's decision becomes, recorded), :mod:`.files` (the step's files as readers see them) and
:mod:`.capacity` (what AWS's refusals change). The Airflow tasks and on-call call these same functions."""
