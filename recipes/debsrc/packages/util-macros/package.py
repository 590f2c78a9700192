# debsrc overlay: util-macros, for the base image's external (recipes/debsrc/README.md)
from spack.package import *
from spack.pkg.builtin.util_macros import UtilMacros as BuiltinUtilMacros


class UtilMacros(BuiltinUtilMacros):
    """The builtin util-macros recipe, able to name a URL for every version.

    Not a Debian source entry: util-macros is never built here, it is the base image's
    external (xutils-dev 1:7.7+7 ships util-macros 1.20.0). The builtin url_for_version
    returns None for 1.20 and later unless the version is listed, and Spack computes a
    source id even for externals, so an external util-macros@1.20.0 stops concretization
    with "URLFetchStrategy requires a url for fetching". X.org publishes 1.20 as .tar.xz."""

    def url_for_version(self, version):
        url = super().url_for_version(version)
        if url is None:
            url = spack.url.substitute_version(self.urls[0], version)
        return url
