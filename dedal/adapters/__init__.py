"""One adapter per external tool. Only modules in this package start processes."""
