"""The papermill engine the notebooks execute with: papermill's nbclient engine, saving the executed notebook less.

Papermill writes the whole executed notebook (nbformat's validation and JSON of 1.6 MB for notebook 01 of the demo,
~0.07 s) when it starts, before and after every cell, and at the end, and ``execute_notebook`` writes it once more
after that: the kernel waits for each write, ~16 of them after the verdict (issue 38 item 3). This engine writes
it when execution starts (the notebook's cells pending: what a crash leaves), during a long cell as papermill's
autosave does (every 30 s while it prints), and once at the end: by papermill's own final write when the notebook
ran (every cell, or up to a failing one: papermill writes that one with its error marker), or by this engine when
execution itself stopped (the kernel died, a timeout) and papermill writes nothing more. The notebook written is the
same object papermill writes, so the executed ``.ipynb`` holds the same cells, outputs and metadata as before.
"""

from __future__ import annotations

NAME = "driftscope"  # the engine's name in papermill's registry


def register() -> str:
    """Register the engine with papermill (once); its name, for ``execute_notebook(engine_name=...)``."""
    from papermill.engines import NBClientEngine, NotebookExecutionManager, papermill_engines

    if NAME in papermill_engines._engines:
        return NAME

    class FewerSaves(NotebookExecutionManager):
        """Papermill's execution manager without its writes before and after each cell."""

        quiet = False

        def save(self, **kwargs):
            if not self.quiet:
                super().save(**kwargs)

        def cell_start(self, cell, cell_index=None, **kwargs):
            self._without_save(super().cell_start, cell, cell_index, **kwargs)

        def cell_complete(self, cell, cell_index=None, **kwargs):
            self._without_save(super().cell_complete, cell, cell_index, **kwargs)

        def _without_save(self, method, *args, **kwargs):
            self.quiet = True
            try:
                method(*args, **kwargs)
            finally:
                self.quiet = False

    class Engine(NBClientEngine):
        @classmethod
        def execute_notebook(
            cls, nb, kernel_name, output_path=None, progress_bar=True, log_output=False, autosave_cell_every=30, **kw
        ):
            manager = FewerSaves(
                nb,
                output_path=output_path,
                progress_bar=progress_bar,
                log_output=log_output,
                autosave_cell_every=autosave_cell_every,
            )
            manager.notebook_start()
            try:
                cls.execute_managed_notebook(manager, kernel_name, log_output=log_output, **kw)
            except BaseException:
                manager.cleanup_pbar()
                manager.notebook_complete()  # papermill writes nothing after this: this is the executed copy
                raise
            manager.cleanup_pbar()
            manager._without_save(manager.notebook_complete)  # papermill's execute_notebook writes it next
            return manager.nb

    papermill_engines.register(NAME, Engine)
    return NAME
