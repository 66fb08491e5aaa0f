// libretryloop.so is linked from the layers' archives (see src/CMakeLists.txt); this file only
// gives the shared library target a source of its own.
