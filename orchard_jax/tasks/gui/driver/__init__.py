"""The program that runs inside each browser sandbox (standard library and Playwright only).

  __main__  the start command: binds the ports, starts the page server and the driver
  pages     the page server: MiniWoB++ pages and the local sites under *.test
  web       the sites' small web framework; shop, mail, booking: the sites
  browser   Chromium through Playwright: actions, settling, observations
  control   the driver's control API (the sandbox's one exposed port)

It is shipped as a zip application (orchard_jax.tasks.gui.bundle) and imports nothing of
orchard_jax; the host side imports the sites' modules to compute what a task expects.
"""
