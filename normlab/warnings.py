"""Warning categories of normlab."""


class NormlabWarning(UserWarning):
    """A valid but questionable setting, e.g. an init the literature reports as harmful."""
