"""The study: the claims of docs/reference.md tested as experiments, each with a verdict decided
by a rule written before any run (docs/study.md).

    claims/        one module per claim, opening with its spec (spec.py); what they share
                   (common.py, ladder.py)
    verdict.py     the verdict rules; profiles.py the study sizes; runner.py runs the study
    context.py     what a claim reads (the StudyContext protocol and its typed records);
                   experiments.py, ladders.py and ladder_runs.py measure and cache it in the
                   study folder
    schema.py      study.json; table.py the verdict table; figures.py the study's figures
    recorded.py    what the recorded studies found; advise.py placement guidance for a shape

`normlab study` (normlab.cli.study) runs it; `normlab report` draws its page. Nothing is
imported here, so importing a module of the study loads only what that module needs.
"""
