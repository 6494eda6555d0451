"""Private temporary folders for the Python tests, removed when the test
process exits (a server's runtime folder, its log, a model written for it)."""
import atexit
import shutil
import tempfile


def temp_dir(prefix):
    """A new folder under the temporary directory, removed with its contents at exit."""
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, True)
    return d
