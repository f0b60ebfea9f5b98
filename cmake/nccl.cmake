# NCCL for the multi-GPU transport (src/comm; only with -DDSINFER_CUDA=ON). Not a distribution
# package on our hosts: it comes from PyPI (nvidia-nccl-cu13 ships include/nccl.h and
# lib/libnccl.so.2; scripts/deps.sh installs it), and on a GPU host torch's pip dependencies bring
# the same package. Searched on every configure, the first root holding both include/nccl.h and
# lib/libnccl.so.2 (or lib64/) wins, so header and library come from one installation:
#   1. -DNCCL_ROOT=DIR
#   2. $NCCL_ROOT
#   3. the nvidia.nccl Python package (a namespace package: its __path__) of $DSI_PYTHON,
#      $VIRTUAL_ENV/bin/python, then python3 on PATH (the interpreters scripts/deps.sh uses)
#   4. the system (libnccl-dev: /usr/include, /usr/lib/<multiarch>)
# -DDSINFER_NCCL=OFF skips the search.
#
# Found: DSINFER_HAVE_NCCL=ON, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_LIBRARY_DIR and
# NCCL_VERSION_STRING. libnccl is NOT linked: src/comm compiles against nccl.h and dlopen()s
# libnccl.so.2 on first use (src/comm/nccl_loader.h), so no binary has NEEDED libnccl.so.2 and
# dsinfer starts on hosts without NCCL; only expert parallelism over NCCL (NcclComm) needs it. The
# loader tries $DSINFER_NCCL_LIBRARY (a path), else dlopen("libnccl.so.2") (LD_LIBRARY_PATH, the
# binary's RUNPATH, the system), else NCCL_LIBRARY_DIR compiled in (DSINFER_NCCL_FALLBACK_DIR).
# NCCL_LIBRARY_DIR is also appended to CMAKE_BUILD_RPATH, so build-tree binaries find this NCCL
# without LD_LIBRARY_PATH (the install RPATH is not touched).
# Not found: DSINFER_HAVE_NCCL=OFF; src/comm still builds and NcclComm::create returns
# kUnimplemented.
option(DSINFER_NCCL "Use NCCL for the multi-GPU transport when found" ON)
set(NCCL_ROOT "" CACHE PATH "NCCL installation (include/nccl.h, lib/libnccl.so.2)")

set(DSINFER_HAVE_NCCL OFF)
set(_dsi_nccl_roots)
if(DSINFER_NCCL)
  if(NCCL_ROOT)
    list(APPEND _dsi_nccl_roots "${NCCL_ROOT}")
  endif()
  if(DEFINED ENV{NCCL_ROOT} AND NOT "$ENV{NCCL_ROOT}" STREQUAL "")
    list(APPEND _dsi_nccl_roots "$ENV{NCCL_ROOT}")
  endif()
  set(_dsi_pythons)
  if(DEFINED ENV{DSI_PYTHON} AND NOT "$ENV{DSI_PYTHON}" STREQUAL "")
    list(APPEND _dsi_pythons "$ENV{DSI_PYTHON}")
  endif()
  if(DEFINED ENV{VIRTUAL_ENV} AND EXISTS "$ENV{VIRTUAL_ENV}/bin/python")
    list(APPEND _dsi_pythons "$ENV{VIRTUAL_ENV}/bin/python")
  endif()
  find_program(DSI_NCCL_PYTHON3 NAMES python3)
  if(DSI_NCCL_PYTHON3)
    list(APPEND _dsi_pythons "${DSI_NCCL_PYTHON3}")
  endif()
  list(REMOVE_DUPLICATES _dsi_pythons)
  foreach(_py IN LISTS _dsi_pythons)
    execute_process(
      COMMAND "${_py}" -c "import nvidia.nccl as m; print(*m.__path__, sep=chr(10))"
      OUTPUT_VARIABLE _out
      RESULT_VARIABLE _rc
      ERROR_QUIET
      OUTPUT_STRIP_TRAILING_WHITESPACE
      TIMEOUT 60)
    if(_rc EQUAL 0 AND NOT _out STREQUAL "")
      string(REPLACE "\n" ";" _out "${_out}")
      list(APPEND _dsi_nccl_roots ${_out})
    endif()
  endforeach()

  foreach(_root IN LISTS _dsi_nccl_roots)
    if(NOT EXISTS "${_root}/include/nccl.h")
      continue()
    endif()
    foreach(_libdir lib lib64)
      if(EXISTS "${_root}/${_libdir}/libnccl.so.2")
        set(NCCL_INCLUDE_DIR "${_root}/include")
        set(NCCL_LIBRARY "${_root}/${_libdir}/libnccl.so.2")
        break()
      endif()
    endforeach()
    if(NCCL_LIBRARY)
      break()
    endif()
  endforeach()
  if(NCCL_ROOT AND NOT NCCL_LIBRARY STREQUAL "${NCCL_ROOT}/lib/libnccl.so.2" AND
     NOT NCCL_LIBRARY STREQUAL "${NCCL_ROOT}/lib64/libnccl.so.2")
    message(WARNING "NCCL_ROOT=${NCCL_ROOT} holds no include/nccl.h with lib/libnccl.so.2 "
                    "(or lib64/); looking elsewhere")
  endif()
  if(NOT NCCL_LIBRARY)
    find_path(_dsi_nccl_sys_inc nccl.h NO_CACHE)
    find_library(_dsi_nccl_sys_lib NAMES libnccl.so.2 nccl NO_CACHE)
    if(_dsi_nccl_sys_inc AND _dsi_nccl_sys_lib)
      set(NCCL_INCLUDE_DIR "${_dsi_nccl_sys_inc}")
      set(NCCL_LIBRARY "${_dsi_nccl_sys_lib}")
    endif()
  endif()
endif()

if(NCCL_LIBRARY)
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _dsi_nccl_ver
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  set(NCCL_VERSION_STRING "")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_dsi_nccl_ver}")
    list(APPEND NCCL_VERSION_STRING "${CMAKE_MATCH_1}")
  endforeach()
  string(REPLACE ";" "." NCCL_VERSION_STRING "${NCCL_VERSION_STRING}")
  if(NCCL_VERSION_STRING VERSION_LESS 2.14)
    message(WARNING "NCCL ${NCCL_VERSION_STRING} at ${NCCL_LIBRARY} is older than 2.14 "
                    "(ncclConfig_t); building src/comm without NCCL")
  else()
    set(DSINFER_HAVE_NCCL ON)
    get_filename_component(NCCL_LIBRARY_DIR "${NCCL_LIBRARY}" DIRECTORY)
    # Not linked (loaded at run time): only the build RUNPATH points at it, for every target
    # defined after this (the dlopen() in src/comm searches the calling executable's RUNPATH).
    list(APPEND CMAKE_BUILD_RPATH "${NCCL_LIBRARY_DIR}")
    message(STATUS "NCCL ${NCCL_VERSION_STRING}: ${NCCL_LIBRARY} (loaded at run time, not linked)")
  endif()
endif()
if(NOT DSINFER_HAVE_NCCL)
  message(STATUS "NCCL not found: src/comm is built without it (NcclComm::create fails; "
                 "pip install nvidia-nccl-cu13 or pass -DNCCL_ROOT=DIR, then reconfigure)")
endif()
