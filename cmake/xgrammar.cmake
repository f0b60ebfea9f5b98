# XGrammar's C++ core (structured outputs: src/grammar). Not a distribution package: scripts/deps.sh
# (dsi_fetch_xgrammar) unpacks its pinned PyPI source distribution into a cache directory and
# test.sh / run.sh pass it here. Searched, in order:
#   1. -DXGRAMMAR_SOURCE_DIR=DIR (holds include/xgrammar/xgrammar.h and cpp/)
#   2. $XGRAMMAR_SOURCE_DIR
# Found: DSINFER_HAVE_XGRAMMAR=ON and a static library `dsinfer_xgrammar` built from its cpp/**/*.cc
# (minus cpp/tvm_ffi, the Python bindings) with our compiler and ccache, once per build tree
# (~6 minutes cold on 2 cores). XGrammar's own CMake needs tvm_ffi, hence this small one.
# Not found: src/grammar builds without it and requests asking for structured outputs get a 400.
# -DDSINFER_XGRAMMAR=OFF skips the search.
option(DSINFER_XGRAMMAR "Use XGrammar for structured outputs when found" ON)
set(XGRAMMAR_SOURCE_DIR "" CACHE PATH "XGrammar source tree (the unpacked PyPI sdist)")

set(DSINFER_HAVE_XGRAMMAR OFF)
if(DSINFER_XGRAMMAR)
  set(_dsi_xgr_dirs)
  if(XGRAMMAR_SOURCE_DIR)
    list(APPEND _dsi_xgr_dirs "${XGRAMMAR_SOURCE_DIR}")
  endif()
  if(DEFINED ENV{XGRAMMAR_SOURCE_DIR} AND NOT "$ENV{XGRAMMAR_SOURCE_DIR}" STREQUAL "")
    list(APPEND _dsi_xgr_dirs "$ENV{XGRAMMAR_SOURCE_DIR}")
  endif()
  foreach(_d IN LISTS _dsi_xgr_dirs)
    if(EXISTS "${_d}/include/xgrammar/xgrammar.h" AND EXISTS "${_d}/cpp/grammar_matcher.cc")
      set(DSINFER_HAVE_XGRAMMAR ON)
      set(DSINFER_XGRAMMAR_DIR "${_d}")
      break()
    endif()
  endforeach()
endif()

if(DSINFER_HAVE_XGRAMMAR)
  message(STATUS "XGrammar: ${DSINFER_XGRAMMAR_DIR}")
  file(GLOB_RECURSE _dsi_xgr_sources CONFIGURE_DEPENDS "${DSINFER_XGRAMMAR_DIR}/cpp/*.cc")
  list(FILTER _dsi_xgr_sources EXCLUDE REGEX "/cpp/tvm_ffi/")
  add_library(dsinfer_xgrammar STATIC ${_dsi_xgr_sources})
  # Its own sources are C++17 code; built as part of this C++20 project. Warnings off: not ours.
  target_compile_options(dsinfer_xgrammar PRIVATE -w)
  target_include_directories(dsinfer_xgrammar SYSTEM
    PUBLIC "${DSINFER_XGRAMMAR_DIR}/include"
           "${DSINFER_XGRAMMAR_DIR}/3rdparty/dlpack/include"
    PRIVATE "${DSINFER_XGRAMMAR_DIR}/cpp"
            "${DSINFER_XGRAMMAR_DIR}/3rdparty/picojson")
  target_compile_definitions(dsinfer_xgrammar
    PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
  target_link_libraries(dsinfer_xgrammar PUBLIC Threads::Threads)
else()
  message(STATUS "XGrammar: not found (structured outputs off; requests asking for them get a 400)")
endif()
