"""Task families on the local sites (shop.test, mail.test, booking.test), each with a checker of
the site's final state, an expert and a wrong program. `TEMPLATES` maps family -> template;
`START_URLS` maps site -> its start page."""
from orchard_jax.tasks.gui.sitetasks import booking, mail, shop
from orchard_jax.tasks.gui.sitetasks.base import Template, Verdict

TEMPLATES = {t.family: t for t in shop.TEMPLATES + mail.TEMPLATES + booking.TEMPLATES}
START_URLS = {"shop": shop.START, "mail": mail.START, "booking": booking.START}

__all__ = ["START_URLS", "TEMPLATES", "Template", "Verdict"]
