# How the tree builds fast (issue 31, docs/decisions.md "The build and test loop").
#
# Precompiled headers. Every translation unit of weft parses nlohmann/json (about 3 s of
# CPU each on this machine kind), the tests gtest (1.7 s) and the programs CLI11 (3.5 s).
# Three small donor targets compile those headers once per build tree; every other target
# that links weft-common reuses one of them, chosen by what it links:
#   GTest                 -> weft-pch-test  (standard library, json, gtest)
#   CLI11 (and not GTest) -> weft-pch-cli   (standard library, json, CLI11)
#   weft-common otherwise -> weft-pch-lib   (standard library, json)
# Targets that link none of these (weft-init, the static helpers, built with other
# flags) get none; a target can also opt out with the property WEFT_NO_PCH, as the donors
# do. Only C++ standard and third-party headers are
# precompiled, never a system C header: a translation unit sees the same declarations it
# would have, plus these.
#
# ccache. When installed (scripts/setup.sh installs it) every compile goes through it,
# keyed on content: a tree whose sources did not change compiles nothing again. Paths
# on command lines are made relative to the source folder, but the unity batches CMake
# writes name their sources by absolute path, so a clone in another folder misses on
# those. Correctness never depends on it: WEFT_CCACHE=OFF, or CCACHE_DISABLE=1 in the
# environment, compiles everything.

option(WEFT_PCH "Precompile the heavy third-party headers (json, gtest, CLI11)" ON)
# The tests' own code (every target that links GTest: the tests and their harnesses) is
# compiled without optimisation in an optimised tree: the product they test stays as
# built (-O2), and a test's own translation unit compiles in half the CPU (one of the
# control plane's unity batches: 43 s at -O2, 20 s at -O0). The sanitizer pass already
# runs every test with all of it at -O0. OFF: the tests as optimised as the product.
option(WEFT_TESTS_O0 "Compile the tests' own code at -O0 in an optimised tree" ON)
option(WEFT_CCACHE "Compile through ccache when it is installed" ON)

if(WEFT_CCACHE)
  find_program(WEFT_CCACHE_EXE ccache)
  if(WEFT_CCACHE_EXE)
    # pch_defines/time_macros: what ccache needs to cache compiles that use a PCH.
    # base_dir + nohashdir + the prefix map below: command lines and debug info do not
    # name the folder.
    set(weft_launcher ${CMAKE_COMMAND} -E env
        "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
        "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}" CCACHE_NOHASHDIR=1 ${WEFT_CCACHE_EXE})
    set(CMAKE_C_COMPILER_LAUNCHER ${weft_launcher})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${weft_launcher})
    add_compile_options(-fdebug-prefix-map=${PROJECT_SOURCE_DIR}=.)
  endif()
endif()

set(WEFT_PCH_STD
    <algorithm> <array> <atomic> <chrono> <cstddef> <cstdint> <cstdio> <cstdlib> <cstring>
    <deque> <filesystem> <functional> <map> <memory> <mutex> <optional> <set> <sstream>
    <string> <string_view> <thread> <unordered_map> <utility> <variant> <vector>)

# weft_tests_o0(TARGET): -O0 for a target of the tests (WEFT_TESTS_O0), after the build
# type's -O2 on the command line, so it wins.
function(weft_tests_o0 target)
  if(WEFT_TESTS_O0)
    target_compile_options(${target} PRIVATE $<$<CONFIG:RelWithDebInfo,Release>:-O0>)
  endif()
endfunction()

# Called once, after weft-common exists (the donors take its definitions and flags).
function(weft_pch_donors)
  if(NOT WEFT_PCH)
    return()
  endif()
  set(dir ${PROJECT_BINARY_DIR}/pch)
  file(MAKE_DIRECTORY ${dir})
  foreach(kind lib test cli)
    set(src ${dir}/${kind}.cc)
    if(NOT EXISTS ${src})
      file(WRITE ${src} "// The weft-pch-${kind} donor: its precompiled header is the product.\n")
    endif()
    add_library(weft-pch-${kind} OBJECT ${src})
    # weft-common's definitions, not a link to it: weft-common itself reuses weft-pch-lib.
    target_compile_definitions(weft-pch-${kind}
      PRIVATE $<TARGET_PROPERTY:weft-common,INTERFACE_COMPILE_DEFINITIONS>)
    target_include_directories(weft-pch-${kind}
      PRIVATE $<TARGET_PROPERTY:weft-common,INTERFACE_INCLUDE_DIRECTORIES>)
    set_target_properties(weft-pch-${kind} PROPERTIES WEFT_NO_PCH ON)
  endforeach()
  target_link_libraries(weft-pch-lib PRIVATE nlohmann_json::nlohmann_json)
  target_precompile_headers(weft-pch-lib PRIVATE ${WEFT_PCH_STD} <nlohmann/json.hpp>)
  target_link_libraries(weft-pch-test PRIVATE nlohmann_json::nlohmann_json GTest::gtest)
  weft_tests_o0(weft-pch-test)  # a precompiled header is used only with the same -O
  target_precompile_headers(weft-pch-test PRIVATE ${WEFT_PCH_STD} <nlohmann/json.hpp>
                            <gtest/gtest.h>)
  target_link_libraries(weft-pch-cli PRIVATE nlohmann_json::nlohmann_json CLI11::CLI11)
  target_precompile_headers(weft-pch-cli PRIVATE ${WEFT_PCH_STD} <nlohmann/json.hpp>
                            <CLI/CLI.hpp>)
endfunction()

function(weft_collect_targets dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    weft_collect_targets(${sub} more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# Called at the end of the top-level CMakeLists: gives every C++ target its donor.
function(weft_apply_pch)
  if(NOT WEFT_PCH)
    return()
  endif()
  weft_collect_targets(${PROJECT_SOURCE_DIR} targets)
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|OBJECT_LIBRARY)$")
      continue()
    endif()
    get_target_property(opted_out ${t} WEFT_NO_PCH)
    if(opted_out)
      continue()
    endif()
    get_target_property(links ${t} LINK_LIBRARIES)
    if(NOT links)
      set(links "")
    endif()
    set(kind "")
    if(t STREQUAL "weft-common" OR t STREQUAL "weft-common-nl" OR "weft-common" IN_LIST links
       OR links MATCHES "weft-[a-z-]*(lib|harness|util)")
      set(kind lib)
    endif()
    if(links MATCHES "CLI11::CLI11")
      set(kind cli)
    endif()
    if(links MATCHES "GTest::")
      set(kind test)
    endif()
    if(kind)
      target_precompile_headers(${t} REUSE_FROM weft-pch-${kind})
    endif()
  endforeach()
endfunction()

# Called at the end of the top-level CMakeLists: -O0 for every target of the tests (those
# that link GTest) when WEFT_TESTS_O0.
function(weft_apply_tests_o0)
  weft_collect_targets(${PROJECT_SOURCE_DIR} targets)
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    get_target_property(links ${t} LINK_LIBRARIES)
    if(type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|OBJECT_LIBRARY)$" AND links MATCHES "GTest::")
      weft_tests_o0(${t})
    endif()
  endforeach()
endfunction()
