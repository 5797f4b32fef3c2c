"""One owner for a step's life, from its plan to its end. The Airflow tasks and on-call call these same functions.

:mod:`.plan` (attempt 1, and every later attempt's records, plan file and manifest), :mod:`.upstream` (what a later
step reads from an earlier one), :mod:`.jobs` (submit, stop, resubmit, resume), :mod:`.capacity` (what AWS's refusals
change), :mod:`.watch` (one poll: the ledger, the backend and the inputs read into a decision), :mod:`.end` (what the
watch's decision becomes, recorded), :mod:`.outputs` (the checks that vouch for a step's outputs before ``_SUCCESS``),
:mod:`.rejects` (rejected rows gathered into parts a resubmission scores), :mod:`.run_report` (the records a step's
run report is built from) and :mod:`.files` (the step's files as readers see them)."""
