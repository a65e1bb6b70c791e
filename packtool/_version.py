"""The package version, in a module of its own so that modules import it without importing the
package's lazy public names (and their import graph)."""

__version__ = "0.1.0"
