# Writes OUT, a C file holding every page file of DIR (web/) as bytes and
# at_webui_asset() to find one by name (serve/webui.h), so the program
# serves the web UI without any file beside it.
#   cmake -DDIR=web -DOUT=build/generated/webui_assets.c -P web/embed.cmake
file(GLOB names RELATIVE ${DIR} ${DIR}/*.html ${DIR}/*.css ${DIR}/*.js ${DIR}/*.svg)
list(SORT names)
set(c "/* Generated from web/ by web/embed.cmake: do not edit. */\n#include <string.h>\n#include \"serve/webui.h\"\n\n")
set(table "")
set(i 0)
foreach(name ${names})
  file(READ ${DIR}/${name} hex HEX)
  string(LENGTH "${hex}" n)
  math(EXPR bytes "${n} / 2")
  # 32 bytes a line
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
  string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){32})" "\\1\n" body "${body}")
  string(APPEND c "static const unsigned char f${i}[${bytes} + 1] = {\n${body}0};\n\n")
  string(APPEND table "    {\"${name}\", f${i}, ${bytes}},\n")
  math(EXPR i "${i} + 1")
endforeach()
string(APPEND c "static const struct {\n    const char *name;\n    const unsigned char *data;\n    size_t len;\n} files[] = {\n${table}};\n\n")
string(APPEND c "int at_webui_asset(const char *name, const unsigned char **data, size_t *len)\n{\n")
string(APPEND c "    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)\n")
string(APPEND c "        if (!strcmp(files[i].name, name)) {\n            *data = files[i].data;\n            *len = files[i].len;\n            return 1;\n        }\n    return 0;\n}\n")
# rewrite only when changed, so the library is not rebuilt for nothing
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL c)
  file(WRITE ${OUT} "${c}")
endif()
