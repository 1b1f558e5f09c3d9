"""Warning categories of normlab. The command line prints them as one line each, `warning: ...`
(or `note: ...` for a `NormlabNote`), without the source line Python's default display adds."""


class NormlabWarning(UserWarning):
    """A valid but questionable setting, e.g. an init the literature reports as harmful."""


class NormlabNote(NormlabWarning):
    """Something normlab did with the input that the user should know of, but that is no
    mistake: e.g. a run's config.yaml given as a config, whose `meta` section is ignored."""
